"""The watching controller: tails the selected run at 4 Hz, rescans the runs folder, feeds the
machine's own probe samples in when no run is selected. Views bind to its signals."""
from __future__ import annotations

from pathlib import Path

from PySide6 import QtCore

from app import run_list, settings

TICK_MS = 250        # 4 Hz redraw (DESIGN.md: not per sample)
SCAN_MS = 2000


class Monitor(QtCore.QObject):
    """Owns the tick and scan timers. ``tick`` fires after new data is read; ``runs`` with summaries."""

    tick = QtCore.Signal()
    runs = QtCore.Signal(list)
    selected = QtCore.Signal(object)  # RunData

    def __init__(self, parent=None):
        super().__init__(parent)
        self.machine = None  # RunData(None), made in start(): RunData needs numpy
        self.current = None
        self._tick = QtCore.QTimer(self, interval=TICK_MS, timeout=self._on_tick)
        self._scan = QtCore.QTimer(self, interval=SCAN_MS, timeout=self.rescan)

    def start(self) -> None:
        """Start the timers and scan once now."""
        from app.run_data import RunData

        self.machine = self.machine or RunData(None)
        self.rescan()
        self._tick.start()
        self._scan.start()

    def select(self, run_dir: str | None) -> None:
        """Watch ``run_dir`` (None: the machine)."""
        if run_dir is not None and self.current is not None and str(self.current.run_dir) == str(Path(run_dir)):
            return
        from app.run_data import RunData

        self.current = RunData(run_dir) if run_dir else None
        if self.current is not None:
            self.current.poll()
            settings.remember_run(str(self.current.run_dir))
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
        """Re-read the run list (status files and first event lines only)."""
        self.runs.emit(run_list.scan(settings.runs_dir(), settings.extra_runs()))

    def _on_tick(self) -> None:
        if self.current is not None:
            self.current.poll()
        self.tick.emit()
