"""The GUI thread never waits (issue 10 item 6): opening a day-long run keeps the event loop
responsive while its 24 h of 1 Hz telemetry and 100k step events are read (off the GUI thread, in
bounded chunks), and killing a process tree happens off it too."""
from __future__ import annotations

import json
import os
import time

import pytest
from conftest import FIXTURES
from PySide6 import QtCore

from app.views.main_window import KEEP, MainWindow

pytestmark = pytest.mark.xdist_group("gui-timing")  # measured one after another, never beside another GUI timing

NO_GPU = str(FIXTURES / "hardware" / "no_gpu.jsonl")
DAY_S = 24 * 3600
STEPS = 100_000
MAX_STALL_MS = 100


def _write_day_long_run(run) -> tuple[int, int]:
    """events.jsonl with 100k steps and telemetry.jsonl with 24 h at 1 Hz (a real snapshot's shape)."""
    run.mkdir(parents=True)
    t0 = 1763700000.0
    snap = json.loads((FIXTURES / "run_dirs" / "laptop_run" / "telemetry.jsonl").read_text().splitlines()[0])
    head, _, tail = json.dumps(snap).partition('"time": 1763700000.0')
    assert tail, "the fixture's first line starts with its time"
    with open(run / "telemetry.jsonl", "w") as fh:
        fh.writelines(f'{head}"time": {t0 + i:.1f}{tail}\n' for i in range(DAY_S))
    step = ('{{"type": "step", "time": {t:.2f}, "step": {s}, "max_steps": {n}, "epoch": 0.5, "loss": {loss:.4f}, '
            '"learning_rate": 0.0002, "grad_norm": 1.0, "tokens_per_second": 3100.0, "samples_per_second": 1.5, '
            '"step_seconds": 0.86, "gpu_memory_allocated_bytes": 12884901888, "gpu_memory_reserved_bytes": '
            '13958643712, "gpu_memory_peak_bytes": 15032385536, "micro_batch_size": 2, '
            '"gradient_accumulation_steps": 8, "eta_seconds": {eta:.0f}}}\n')
    with open(run / "events.jsonl", "w") as fh:
        fh.write(json.dumps({"type": "run_started", "time": t0, "attempt": 1, "pid": 1}) + "\n")
        fh.writelines(step.format(t=t0 + s * 0.864, s=s, n=STEPS, loss=1.2 + 2.5 / (1 + s / 5000), eta=STEPS - s)
                      for s in range(1, STEPS + 1))
        fh.write(json.dumps({"type": "finished", "time": t0 + DAY_S, "step": STEPS}) + "\n")
    (run / "status.json").write_text(json.dumps({"state": "finished", "step": STEPS, "max_steps": STEPS}))
    (run / "config.yaml").write_text("name: day-long\n")
    return (run / "telemetry.jsonl").stat().st_size, (run / "events.jsonl").stat().st_size


class StallMeter(QtCore.QObject):
    """A 10 ms timer on the GUI thread. Between two of its ticks, the wall-clock gap is the stall a
    user sees; the GUI thread's own CPU time in that gap is the part our code caused (on a machine
    with more runnable threads than cores the OS also parks the thread, which no code can avoid)."""

    def __init__(self):
        super().__init__()
        self.longest_ms = 0.0        # wall clock, minus the 10 ms interval
        self.longest_cpu_ms = 0.0    # GUI-thread CPU time between two ticks
        self.ticks = 0
        self.most_runnable = 0       # the most threads of other processes runnable at once, seen at a tick
        self._last = self._last_cpu = 0.0
        self._timer = QtCore.QTimer(self, interval=10, timeout=self._tick)
        self._timer.setTimerType(QtCore.Qt.PreciseTimer)

    def start(self) -> None:
        self._last, self._last_cpu = time.perf_counter(), time.thread_time()
        self._timer.start()

    def _tick(self) -> None:
        now, cpu = time.perf_counter(), time.thread_time()
        self.longest_ms = max(self.longest_ms, (now - self._last) * 1000 - 10)
        self.longest_cpu_ms = max(self.longest_cpu_ms, (cpu - self._last_cpu) * 1000)
        self._last, self._last_cpu = now, cpu
        self.ticks += 1
        self.most_runnable = max(self.most_runnable, runnable())


def runnable() -> int:
    """Threads of other processes runnable on the machine now (Linux: /proc/stat's procs_running less this
    process's running threads); 0 elsewhere."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            everyone = next((int(line.split()[1]) for line in f if line.startswith("procs_running")), 0)
        ours = 0
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/stat", encoding="ascii") as f:
                    ours += f.read().rsplit(")", 1)[1].split()[0] == "R"
            except OSError:
                pass
        return max(0, everyone - ours)
    except OSError:
        return 0


def oversubscribed(meter: StallMeter) -> bool:
    """True when, beside the GUI thread, other processes' threads wanted every core (CI neighbours, other helpers,
    the other xdist worker's children) during the measurement: the load average, which trails by a minute, or the
    threads runnable at the meter's ticks (a burst that starts with the test, such as children importing torch)."""
    cores = os.cpu_count() or 1
    return os.getloadavg()[0] > cores or meter.most_runnable >= cores


@pytest.mark.slow  # measured >= 3.5 s on the 2-core machine
def test_opening_a_day_long_run_never_stalls_the_window(qtbot, tmp_path):
    tele_bytes, event_bytes = _write_day_long_run(tmp_path / "runs" / "day-long")
    w = MainWindow(NO_GPU)
    w.ask_close_choice = lambda runs: KEEP
    qtbot.addWidget(w)
    w.show()
    qtbot.wait(300)  # the window's own start-up is not what is measured
    try:
        meter = StallMeter()
        meter.start()
        started = time.perf_counter()
        w.open_run(str(tmp_path / "runs" / "day-long"))
        qtbot.waitUntil(lambda: w.monitor.current.loaded, timeout=240_000)
        loss = w.run_view.dashboard.curves["loss"]  # the first full draw is staged over a few ticks
        qtbot.waitUntil(lambda: loss.xData is not None and len(loss.xData) == STEPS, timeout=20_000)
        qtbot.wait(600)  # a few redraws of the full day
        load_s = time.perf_counter() - started
        data = w.monitor.current
        assert len(data.loss) == STEPS and data.loss.x[-1] == STEPS
        assert len(data.host_ram_available) == DAY_S
        assert len(w.run_view.dashboard.curves["loss"].xData) == STEPS
        assert "step 100000 of 100000" in w.run_view.dashboard.headline.text()
        print(f"\nread {tele_bytes / 2**20:.0f} MiB telemetry + {event_bytes / 2**20:.0f} MiB events in "
              f"{load_s:.1f} s; longest GUI stall {meter.longest_ms:.0f} ms wall, {meter.longest_cpu_ms:.0f} ms of "
              f"GUI-thread work, over {meter.ticks} ticks; load average {os.getloadavg()[0]:.1f}, at most "
              f"{meter.most_runnable} other threads runnable, on {os.cpu_count()} cores")
        assert meter.longest_cpu_ms <= MAX_STALL_MS, \
            f"the GUI thread worked {meter.longest_cpu_ms:.0f} ms without a break"
        if not oversubscribed(meter):  # on a shared, overloaded machine the OS parks threads for longer than that
            assert meter.longest_ms <= MAX_STALL_MS, f"the GUI thread stalled {meter.longest_ms:.0f} ms"
    finally:  # a failed assertion must not leave the hardware feed writing to a deleted window
        w.hardware.stop()
