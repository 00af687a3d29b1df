"""The watching controller: tails the selected run at 4 Hz, rescans the runs folder, feeds the
machine's own probe samples in when no run is selected. Views bind to its signals.

Reading and JSON parsing happen on a private reader thread in bounded chunks (``RunReader``); the
GUI thread only appends the parsed columns (``RunData.apply``), so opening a day-long run never
stalls the window. A backlog is read chunk after chunk without waiting for the next tick."""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from PySide6 import QtCore

from app.model import run_index
from app.ops import settings
from app.ops.background import Latest, own_pool

TICK_MS = 250        # 4 Hz redraw, not per sample (docs/design.md, "The GPU and the GUI")
SCAN_MS = 2000


_niced: set[int] = set()


def _background(fn):
    """Run ``fn`` with this worker thread at a lower OS priority (Linux: per-thread nice 10), so on
    a busy machine the scheduler prefers the GUI thread; elsewhere it simply runs ``fn``."""
    tid = threading.get_native_id()
    if tid not in _niced and hasattr(os, "setpriority") and sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, tid, 10)
        except OSError:
            pass
        _niced.add(tid)
    return fn()


class Monitor(QtCore.QObject):
    """Owns the tick and scan timers. ``tick`` fires after new data is read; ``runs`` with summaries."""

    tick = QtCore.Signal()
    runs = QtCore.Signal(list)
    selected = QtCore.Signal(object)  # RunData

    def __init__(self, parent=None):
        super().__init__(parent)
        self.machine = None  # RunData(None), made in start(): RunData needs numpy
        self.current = None
        self._pool = own_pool(1)
        self._reads = Latest(self._read_done, self._read_failed, self, pool=self._pool)
        self._scans = Latest(self.runs.emit, lambda _exc: None, self, pool=own_pool(1))  # retried next scan
        self._reading = None  # the RunData whose read is in flight
        self._tick = QtCore.QTimer(self, interval=TICK_MS, timeout=self._on_tick)
        self._scan = QtCore.QTimer(self, interval=SCAN_MS, timeout=self.rescan)

    def start(self) -> None:
        """Start the timers and scan once now."""
        from app.model.run_data import RunData

        self.machine = self.machine or RunData(None)
        self.rescan()
        self._tick.start()
        self._scan.start()

    def select(self, run_dir: str | None) -> None:
        """Watch ``run_dir`` (None: the machine). Returns at once; data arrives over the next ticks."""
        if run_dir is not None and self.current is not None and str(self.current.run_dir) == str(Path(run_dir)):
            return
        from app.model.run_data import RunData

        self._reads.cancel()  # a chunk of the previous run must not land after the switch
        self._reading = None
        self.current = RunData(run_dir) if run_dir else None
        if self.current is not None:
            settings.remember_run(str(self.current.run_dir))
            self._read(self.current)
        self.selected.emit(self.current or self.machine)
        self.tick.emit()

    def shown(self):
        """The RunData on screen."""
        return self.current or self.machine

    def add_machine_snapshot(self, snap) -> None:
        """Append a probe sample (a MachineSnapshot) to the machine series."""
        if self.machine is None:
            return
        self.machine.add_snapshot(snap.to_dict())
        self.machine.version += 1

    def rescan(self) -> None:
        """Re-read the run list off the GUI thread (each run's state from runstate); ``runs`` brings it."""
        runs_dir, extra = settings.runs_dir(), settings.extra_runs()
        self._scans.submit(lambda: _background(lambda: run_index.scan(runs_dir, extra)))

    # -- reading --------------------------------------------------------------------------------
    def _read(self, data) -> None:
        if self._reading is not None:
            return  # one read at a time per reader; the next tick asks again
        self._reading = data
        reader = data.reader
        self._reads.submit(lambda: _background(reader.read))

    def _read_done(self, batch) -> None:
        data, self._reading = self._reading, None
        if data is None or data is not self.current:
            return
        data.apply(batch)
        if batch.more:
            self._read(data)  # a backlog: the next chunk now, not at the next tick

    def _read_failed(self, _exc: Exception) -> None:
        self._reading = None  # an unreadable file is retried at the next tick

    def _on_tick(self) -> None:
        if self.current is not None:
            self._read(self.current)
        self.tick.emit()
