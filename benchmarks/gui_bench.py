"""GUI figures: cold start to first shown window, dashboard redraw with 24 h of 1 Hz data on six
series, and GUI memory (RSS). Prints measurements; it does not pass or fail.

    QT_QPA_PLATFORM=offscreen python benchmarks/gui_bench.py [--starts 5] [--frames 300] [--try-it RUN_DIR]

Targets (issue 5): cold start ≤ 1.0 s, redraw p95 ≤ 16 ms, RSS ≤ 250 MB. ``--try-it RUN_DIR`` also streams an answer
of a trained run (and of its base model: two ``trainpilot-cli chat`` children) into the Try it tab and measures the
GUI thread meanwhile: the longest gap between two ticks of a 10 ms timer (wall) and the GUI thread's own CPU time in
one gap (the part TrainPilot's code causes; target ≤ 100 ms). tests/app/test_try_it.py asserts the behaviour (tokens
arrive one by one, read as they come); this prints the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DAY = 86_400
GIB = 1 << 30

CHILD = r"""
import sys, time, json
t_import = time.time()
from PySide6 import QtCore, QtWidgets
app = QtWidgets.QApplication([])
from app.views.main_window import MainWindow
w = MainWindow(None, lazy=True)  # as app.main does
marks = {}
def maybe_quit():
    if "paint" in marks and "ready" in marks:
        QtCore.QTimer.singleShot(0, app.quit)
def ready():
    marks["ready"] = time.time(); maybe_quit()
w.startup_done.connect(ready)
class Watch(QtCore.QObject):
    def eventFilter(self, obj, ev):
        if ev.type() == QtCore.QEvent.Paint and "paint" not in marks:
            marks["paint"] = time.time(); maybe_quit()
        return False
watch = Watch(); w.installEventFilter(watch)
w.show()
QtCore.QTimer.singleShot(10000, app.quit)
app.exec()
import psutil
print(json.dumps({"first_paint": marks.get("paint"), "ready": marks.get("ready"), "rss": psutil.Process().memory_info().rss}))
w.hardware.stop()
"""


def cold_starts(n: int) -> list[dict]:
    """Spawn the app ``n`` times; seconds from process spawn to the main window's first paint."""
    out = []
    for _ in range(n):
        with tempfile.TemporaryDirectory() as home:
            env = dict(os.environ, TRAINPILOT_HOME=home, QT_QPA_PLATFORM=os.environ.get("QT_QPA_PLATFORM", "offscreen"))
            t0 = time.time()
            res = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
            line = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
            if not line:
                raise SystemExit(f"child failed: {res.stderr[-2000:]}")
            data = json.loads(line[-1])
            out.append({"seconds": data["first_paint"] - t0, "ready": data["ready"] - t0, "rss": data["rss"]})
    return out


def day_of_data():
    """A RunData holding 24 h of 1 Hz telemetry and one step per second (six plotted series+)."""
    import numpy as np

    from app.model.run_data import RunData

    d = RunData(None)
    t = 1.7e9 + np.arange(DAY, dtype=np.float64)
    rng = np.random.default_rng(0)
    d.vram_used.extend(t, 14 * GIB + rng.normal(0, 0.1 * GIB, DAY))
    d.vram_total.extend(t, np.full(DAY, 16 * GIB))
    d.temperature.extend(t, 75 + 8 * np.sin(t / 900) + rng.normal(0, 0.5, DAY))
    d.power.extend(t, 140 + rng.normal(0, 5, DAY))
    d.utilization.extend(t, np.clip(95 + rng.normal(0, 4, DAY), 0, 100))
    d.tokens_per_s.extend(t, 3000 + rng.normal(0, 60, DAY))
    steps = np.arange(1, DAY + 1, dtype=np.float64)
    d.loss.extend(steps, 1.2 + 2.5 * np.exp(-steps / 20000) + rng.normal(0, 0.02, DAY))
    d.lr.extend(steps, 2e-4 * np.cos(steps / DAY * np.pi / 2))
    d.throttle_periods = [[float(t[i]), float(t[i + 300])] for i in range(1000, DAY - 400, 7200)]
    return d, t[-1]


def redraw_frames(frames: int) -> tuple[list[float], list[float], float]:
    """Per-frame wall ms and CPU ms of: append one new sample per series, refresh the dashboard,
    paint it. Also the RSS (bytes) afterwards."""
    from PySide6 import QtWidgets

    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication([])
    from app.views.dashboard import Dashboard

    data, t_last = day_of_data()
    dash = Dashboard()
    dash.resize(1280, 800)
    dash.show()
    dash.set_data(data)
    dash.repaint()
    app.processEvents()
    times, cpu = [], []
    for i in range(frames):
        t = t_last + 1 + i
        start, cpu0 = time.perf_counter(), time.process_time()
        for s, v in ((data.vram_used, 14 * GIB), (data.temperature, 76.0), (data.power, 141.0),
                     (data.utilization, 96.0), (data.tokens_per_s, 3010.0), (data.vram_total, 16 * GIB),
                     (data.host_ram_available, 20 * GIB)):
            s.append(t, v)
        data.loss.append(DAY + 1 + i, 1.25)
        data.lr.append(DAY + 1 + i, 1e-6)
        dash.refresh()
        dash.repaint()
        app.processEvents()
        times.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - cpu0) * 1000)
    import psutil

    return times, cpu, psutil.Process().memory_info().rss


def try_it_stall(run_dir: str, tokens: int) -> dict:
    """Stream ``tokens`` greedy tokens of ``run_dir``'s model and its base into the Try it tab; the longest wall gap
    between two 10 ms ticks and the most GUI-thread CPU time within one gap (ms), and the tokens streamed."""
    from PySide6 import QtCore, QtWidgets

    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication([])
    from app.views.try_it import TryItTab
    from trainer.rundir.runstate import read_run_state

    tab = TryItTab()
    tab.show()
    tab.bind(run_dir)
    tab.follow(read_run_state(run_dir))
    tab.prompt.setPlainText("Once upon a time")
    tab.max_tokens.setValue(tokens)
    tab.temperature.setValue(0.0)
    gaps = {"wall": 0.0, "cpu": 0.0, "last": time.perf_counter(), "last_cpu": time.thread_time()}

    def tick():
        now, cpu = time.perf_counter(), time.thread_time()
        gaps["wall"] = max(gaps["wall"], now - gaps["last"])
        gaps["cpu"] = max(gaps["cpu"], cpu - gaps["last_cpu"])
        gaps["last"], gaps["last_cpu"] = now, cpu

    timer = QtCore.QTimer(interval=10, timeout=tick)
    timer.setTimerType(QtCore.Qt.PreciseTimer)
    timer.start()
    if not tab.send():
        raise SystemExit(f"Try it refused: {tab.status.text()}")
    end = time.monotonic() + 600
    while tab.busy() and time.monotonic() < end:
        app.processEvents(QtCore.QEventLoop.AllEvents, 50)
        time.sleep(0.005)
    timer.stop()
    return {"wall_ms": gaps["wall"] * 1000 - 10, "cpu_ms": gaps["cpu"] * 1000,
            "text": len(tab.tuned.text()), "status": tab.status.text()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--starts", type=int, default=5)
    p.add_argument("--frames", type=int, default=300)
    p.add_argument("--try-it", default=None, metavar="RUN_DIR", help="also measure Try it streaming from this run")
    p.add_argument("--tokens", type=int, default=40, help="tokens Try it streams (with --try-it)")
    args = p.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    starts = cold_starts(args.starts)
    secs = [s["seconds"] for s in starts]
    ready = [s["ready"] for s in starts]
    print(f"cold start to first painted main window: median {statistics.median(secs):.3f} s, "
          f"min {min(secs):.3f} s, max {max(secs):.3f} s over {len(secs)} launches (target ≤ 1.0 s)")
    print(f"cold start until the dashboard, run watcher and probe are up: median {statistics.median(ready):.3f} s, "
          f"max {max(ready):.3f} s")
    print(f"GUI RSS once started (window, dashboard, probe; no run): {statistics.median(s['rss'] for s in starts) / 1e6:.0f} MB "
          "(target ≤ 250 MB)")
    times, cpu, rss = redraw_frames(args.frames)
    times.sort()
    cpu.sort()
    p95 = times[int(0.95 * (len(times) - 1))]
    print(f"dashboard frame with 24 h of 1 Hz data (7 curves × {DAY:,} points: VRAM, temperature, power, "
          f"utilisation, tokens/s, loss, LR; 1280×800): wall p50 {statistics.median(times):.1f} ms, "
          f"p95 {p95:.1f} ms, max {times[-1]:.1f} ms over {len(times)} frames (target p95 ≤ 16 ms)")
    print(f"  same frames, CPU time of this process: p50 {statistics.median(cpu):.1f} ms, "
          f"p95 {cpu[int(0.95 * (len(cpu) - 1))]:.1f} ms (wall minus CPU is waiting for a core)")
    print(f"GUI RSS with the 24 h dashboard loaded: {rss / 1e6:.0f} MB (target ≤ 250 MB)")
    if args.try_it:
        r = try_it_stall(args.try_it, args.tokens)
        print(f"Try it streaming {args.tokens} tokens from {args.try_it} and its base: longest event-loop gap "
              f"{r['wall_ms']:.0f} ms wall, {r['cpu_ms']:.0f} ms of GUI-thread work (target ≤ 100 ms); "
              f"{r['text']} characters shown, status: {r['status']!r}")
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    print(f"platform: QT_QPA_PLATFORM={os.environ['QT_QPA_PLATFORM']}, python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs, load average {load[0]:.2f} during the run")


if __name__ == "__main__":
    main()
