"""The runs list: state, start time and progress of every run folder (scan + view).

At narrow widths (an 800×600 window) no column is cut: the run's name takes what is left (elided, the
full path and start time in its tooltip), and the start time column is hidden when the state and
progress would not fit beside a readable name."""
from __future__ import annotations

from pathlib import Path

from PySide6 import QtCore, QtWidgets

from app.model.fmt import clock
from app.model.run_index import RunSummary, scan  # noqa: F401  (scan: re-exported for callers)


NAME_MIN_PX = 110  # the run name column never gets narrower than this (pixels)
STARTED = 2


class RunList(QtWidgets.QTreeWidget):
    """Runs as rows; emits ``selected(path)``."""

    selected = QtCore.Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setHeaderLabels(["Run", "State", "Started", "Progress"])
        self.setRootIsDecorated(False)
        self.setUniformRowHeights(True)
        self.setTextElideMode(QtCore.Qt.ElideMiddle)  # run names differ at the end (their time stamp)
        header = self.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(0, QtWidgets.QHeaderView.Stretch)
        for col in (1, 2, 3):
            header.setSectionResizeMode(col, QtWidgets.QHeaderView.ResizeToContents)
        self.setMinimumWidth(280)
        self.itemSelectionChanged.connect(self._on_selection)
        self._rows: tuple = ()
        self._wanted: str | None = None  # a folder to select once a scan lists it

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
            item.setToolTip(0, f"{r.path}\nstarted {clock(r.started)}" if r.started else r.path)
            item.setToolTip(1, r.reason or "")  # why it differs from status.json (a killed supervisor)
            self.addTopLevelItem(item)
            if r.path == current:
                item.setSelected(True)
        self.blockSignals(False)
        self._fit_columns()
        if self._wanted is not None:
            self.select_path(self._wanted)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit_columns()

    def _fit_columns(self) -> None:
        """Hide the start time when it would squeeze the name below NAME_MIN_PX (nothing is cut)."""
        def width(col: int) -> int:
            return max(self.header().sectionSizeHint(col), self.sizeHintForColumn(col))

        room = self.viewport().width() - NAME_MIN_PX - width(1) - width(3)
        self.setColumnHidden(STARTED, room < width(STARTED))

    def select_path(self, path: str) -> None:
        """Select the row of ``path`` (emits ``selected``); a folder not listed yet (the scan runs off
        the GUI thread) is selected when a scan lists it."""
        for i in range(self.topLevelItemCount()):
            item = self.topLevelItem(i)
            if item.data(0, QtCore.Qt.UserRole) == path:
                self._wanted = None
                self.setCurrentItem(item)
                return
        self._wanted = path

    def current_path(self) -> str | None:
        """The selected run folder."""
        items = self.selectedItems()
        return items[0].data(0, QtCore.Qt.UserRole) if items else None

    def _on_selection(self) -> None:
        path = self.current_path()
        if path:
            self._wanted = None
            self.selected.emit(path)
