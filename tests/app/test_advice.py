"""Warnings say what to do: other GPU apps, full VRAM, heat/throttling, low RAM while offloading,
throughput collapse with full VRAM (shared-memory spill), low GPU utilisation."""
from __future__ import annotations

import json
import os

import getpass

from conftest import SHOWN_MS
from PySide6 import QtWidgets

from app.model import advice
from app.model.run_data import RunData
from trainer.rundir.runstate import read_run_state
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


def test_vram_full_spill_low_util_and_low_ram(tmp_path):
    (tmp_path / "status.json").write_text(json.dumps({"state": "running", "pid": os.getpid()}))  # a live run
    data = RunData(tmp_path)
    data.plan = {"settings": {"deepspeed.offload_optimizer": True}}
    for t in range(40):
        data.add_snapshot({"time": float(t), "gpus": [_gpu(memory_used_bytes=int(15.6 * GIB), utilization_pct=20.0)],
                           "host": {"ram_total_bytes": 32 * GIB, "ram_available_bytes": GIB}})
        data.tokens_per_s.append(float(t), 3000.0 if t < 25 else 900.0)
    data.run_state = read_run_state(tmp_path)
    items = {a.key: a.text for a in advice.collect(data, None)}
    assert {"vram", "spill", "ram", "util"} <= set(items)
    assert "Sysmem Fallback" in items["spill"] and "num_workers" in items["util"]
    assert "offload" in items["ram"] and "97%" in items["vram"]


def test_every_warning_the_run_wrote_is_in_the_warnings_tab(qtbot, fixture_run):
    run = fixture_run("cpu_demo")
    with open(run / "events.jsonl", "a", encoding="utf-8") as fh:
        for e in ({"type": "warning", "time": 2e9, "code": "skipped_lines",
                   "message": "data.path: 3 lines skipped (not JSON): lines 4, 9, 12"},
                  {"type": "warning", "time": 2e9, "code": "notify_unset", "message": "notify: HOOK is not set"},
                  {"type": "warning", "time": 2e9, "code": "a_code_from_a_newer_trainer"},
                  {"type": "oom", "time": 2e9, "message": "CUDA out of memory at step 3"},
                  {"type": "retry", "time": 2e9, "attempt": 2, "reason": "out of memory", "why": "an OOM at step 3"},
                  {"type": "retry", "time": 2e9, "attempt": 3, "reason": "out of memory", "why": "ZeRO-2 offload",
                   "engine_change": {"from": "plain PyTorch (AdamW)", "to": "DeepSpeed ZeRO-2", "carried": [
                       "weights", "AdamW moments"], "not_carried": ["the fp16 loss scale"]}}):
            fh.write(json.dumps(e) + "\n")
    data = RunData(run)
    data.poll()
    view = WarningsView()
    qtbot.addWidget(view)
    view.show_advice(advice.collect(data, None))
    texts = view.texts()
    assert "data.path: 3 lines skipped (not JSON): lines 4, 9, 12" in texts
    assert "notify: HOOK is not set" in texts and "a code from a newer trainer" in texts
    assert "Out of GPU memory: CUDA out of memory at step 3." in texts
    assert "Attempt 2 started automatically after an OOM at step 3." in texts
    assert ("Attempt 3 started automatically after ZeRO-2 offload. It moved from plain PyTorch (AdamW) to DeepSpeed "
            "ZeRO-2, carrying weights, AdamW moments; not carried: the fp16 loss scale.") in texts


def test_a_cpu_run_shows_no_gpu_warnings(fixture_run):
    run = fixture_run("cpu_demo")  # planned for the CPU; the machine also has a hot, full, busy GPU
    data = RunData(run)
    hot = {"time": 1.0, "gpus": [_gpu(memory_used_bytes=int(15.9 * GIB), temperature_c=90.0,
                                      processes=[{"pid": 4242, "name": "brave", "used_memory_bytes": GIB}])]}
    # Before its folder is read (its plan not known yet): no GPU warnings either (walkthrough 8: "Warnings (4)", then
    # "No warnings", as a CPU run's folder was read).
    assert not data.loaded and advice.collect(data, hot) == []
    data.poll()
    assert data.on_cpu()
    assert advice.collect(data, hot) == []
    machine = RunData(None)  # the same snapshot with no run selected: the GPU warnings are shown
    assert {"vram", "heat", "app:4242"} <= {a.key for a in advice.collect(machine, hot)}


def test_replaced_warnings_leave_no_ghost_rows(qtbot):
    view = WarningsView()
    qtbot.addWidget(view)
    view.resize(600, 400)
    view.show()
    view.show_advice([advice.Advice("a", "info", "first"), advice.Advice("b", "warning", "second")])
    old_rows = [view._lay.itemAt(i).widget() for i in range(view._lay.count() - 1)]
    qtbot.waitUntil(lambda: all(row.isVisible() for row in old_rows), timeout=SHOWN_MS)
    view.show_advice([advice.Advice("c", "info", "third")])  # before the deferred deletes run
    assert old_rows and not any(row.isVisible() for row in old_rows)
