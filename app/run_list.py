"""The runs list: state, start time and progress of every run folder (scan + view)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from PySide6 import QtCore, QtWidgets

from app.fmt import clock
from trainer.rundir import events as ev


@dataclass(frozen=True)
class RunSummary:
    """One row: folder, state, start time (Unix seconds or None), step and max_steps."""

    path: str
    state: str
    started: float | None
    step: int | None
    max_steps: int | None

    @property
    def progress(self) -> str:
        """'12 / 40 (30%)' or ''."""
        if not self.max_steps:
            return "" if self.step is None else str(self.step)
        step = self.step or 0
        return f"{step} / {self.max_steps} ({step / self.max_steps:.0%})"


def is_run_dir(path: Path) -> bool:
    """True for a folder that looks like a run directory."""
    return path.is_dir() and any((path / f).exists() for f in (ev.STATUS_FILE, ev.EVENTS_FILE, "config.yaml"))


def summarize(path: Path) -> RunSummary:
    """Read status.json and the first event line (cheap: never the whole event file)."""
    status = ev.read_status(path) or {}
    started, first_type = None, None
    try:
        with open(path / ev.EVENTS_FILE, "rb") as fh:
            first = json.loads(fh.readline())
            started, first_type = first.get("time"), first.get("type")
    except (OSError, ValueError, AttributeError):
        pass
    if started is None:
        try:
            started = (path / "config.yaml").stat().st_mtime
        except OSError:
            pass
    state = status.get("state") or ("failed" if first_type == "failed" else "new")  # a start that failed early
    return RunSummary(str(path), state, started, status.get("step"), status.get("max_steps"))


def scan(runs_dir: Path, extra: list[str]) -> list[RunSummary]:
    """Every run under ``runs_dir`` plus the extra folders, newest first."""
    paths = {p.resolve() for p in runs_dir.iterdir() if is_run_dir(p)} if runs_dir.is_dir() else set()
    paths |= {Path(p).resolve() for p in extra if is_run_dir(Path(p))}
    rows = [summarize(p) for p in paths]
    return sorted(rows, key=lambda r: r.started or 0, reverse=True)


class RunList(QtWidgets.QTreeWidget):
    """Runs as rows; emits ``selected(path)``."""

    selected = QtCore.Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setHeaderLabels(["Run", "State", "Started", "Progress"])
        self.setRootIsDecorated(False)
        self.setUniformRowHeights(True)
        self.itemSelectionChanged.connect(self._on_selection)
        self._rows: tuple = ()

    def show_runs(self, rows: list[RunSummary]) -> None:
        """Replace the rows (keeps the selection; does nothing when unchanged)."""
        if tuple(rows) == self._rows:
            return
        self._rows = tuple(rows)
        current = self.current_path()
        self.blockSignals(True)
        self.clear()
        for r in rows:
            item = QtWidgets.QTreeWidgetItem([Path(r.path).name, r.state, clock(r.started), r.progress])
            item.setData(0, QtCore.Qt.UserRole, r.path)
            item.setToolTip(0, r.path)
            self.addTopLevelItem(item)
            if r.path == current:
                item.setSelected(True)
        self.blockSignals(False)
        for col in range(4):
            self.resizeColumnToContents(col)

    def select_path(self, path: str) -> None:
        """Select the row of ``path`` (emits ``selected``)."""
        for i in range(self.topLevelItemCount()):
            item = self.topLevelItem(i)
            if item.data(0, QtCore.Qt.UserRole) == path:
                self.setCurrentItem(item)
                return

    def current_path(self) -> str | None:
        """The selected run folder."""
        items = self.selectedItems()
        return items[0].data(0, QtCore.Qt.UserRole) if items else None

    def _on_selection(self) -> None:
        path = self.current_path()
        if path:
            self.selected.emit(path)
