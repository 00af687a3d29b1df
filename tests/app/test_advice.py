"""Warnings say what to do: other GPU apps, full VRAM, heat/throttling, low RAM while offloading,
throughput collapse with full VRAM (shared-memory spill), low GPU utilisation."""
from __future__ import annotations

import getpass

from PySide6 import QtWidgets

from app.model import advice
from app.model.run_data import RunData
from app.views.warnings_view import WarningsView

GIB = 1 << 30


def _gpu(**kw):
    g = {"memory_total_bytes": 16 * GIB, "memory_used_bytes": 4 * GIB, "temperature_c": 60.0,
         "throttle_reasons": [], "is_laptop": True, "processes": [], "utilization_pct": 95.0}
    g.update(kw)
    return g


def test_recorded_run_warns_about_browser_and_heat(fixture_run):
    data = RunData(fixture_run("laptop_run"))
    data.poll()
    snap = dict(data.last_snapshot)
    snap["gpus"] = [dict(snap["gpus"][0], throttle_reasons=["thermal"], temperature_c=87.0)]
    texts = [a.text for a in advice.collect(data, snap)]
    assert any(t.startswith("Close brave to free 0.4 GiB") for t in texts)
    assert not any(t.startswith("Close Xorg") for t in texts)
    assert any("87.0 °C" in t and "thermal" in t and "cooling pad" in t for t in texts)


def test_own_process_gets_end_button_others_do_not(qtbot):
    me = getpass.getuser()
    gpu = _gpu(processes=[{"pid": 11, "name": "brave", "user": me, "used_memory_bytes": GIB},
                          {"pid": 12, "name": "steam", "user": "someone-else", "used_memory_bytes": 200 << 20},
                          {"pid": 13, "name": "python", "user": me, "used_memory_bytes": 8 * GIB},
                          {"pid": 14, "name": "Xorg", "user": "root", "used_memory_bytes": 300 << 20}])
    items = advice.collect(None, {"gpus": [gpu]}, run_pids={13})
    by_pid = {a.key: a for a in items}
    assert "app:14" not in by_pid and "Xorg" in by_pid["desktop"].text  # never "close your desktop"
    assert by_pid["app:11"].pid == 11 and by_pid["app:12"].pid is None and "app:13" not in by_pid
    view = WarningsView()
    qtbot.addWidget(view)
    view.show_advice(items)
    with qtbot.waitSignal(view.end_process) as sig:
        next(b for b in view.findChildren(QtWidgets.QPushButton) if "brave" in b.text()).click()
    assert sig.args == [11, "brave"]


def test_vram_full_spill_low_util_and_low_ram():
    data = RunData(None)
    data.plan = {"settings": {"deepspeed.offload_optimizer": True}}
    for t in range(40):
        data.add_snapshot({"time": float(t), "gpus": [_gpu(memory_used_bytes=int(15.6 * GIB), utilization_pct=20.0)],
                           "host": {"ram_total_bytes": 32 * GIB, "ram_available_bytes": GIB}})
        data.tokens_per_s.append(float(t), 3000.0 if t < 25 else 900.0)
    data.status = {"state": "running"}
    items = {a.key: a.text for a in advice.collect(data, None)}
    assert {"vram", "spill", "ram", "util"} <= set(items)
    assert "Sysmem Fallback" in items["spill"] and "num_workers" in items["util"]
    assert "offload" in items["ram"] and "97%" in items["vram"]
