"""The runs list: state, start time and progress of every run folder (scan + view).

At narrow widths (an 800×600 window) no column is cut and the run names keep their width: the start time
column is hidden, then the progress shows as a percentage, then it hides (the dashboard shows the selected run's;
each name's tooltip has it); only a name longer than what is left is elided
(the full path and start time in its tooltip)."""
from __future__ import annotations

from pathlib import Path

from PySide6 import QtCore, QtWidgets

from app.model.fmt import clock
from app.model.run_index import RunSummary, scan  # noqa: F401  (scan: re-exported for callers)


NAME_MIN_PX = 110  # the run name column never gets narrower than this (pixels)
STARTED, PROGRESS = 2, 3


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
        self.setMinimumWidth(300)  # a run's name, its state and a percentage at 800×600
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
            item.setData(PROGRESS, QtCore.Qt.UserRole, r.progress)
            item.setToolTip(PROGRESS, r.progress)
            item.setToolTip(0, "\n".join(x for x in (r.path, f"started {clock(r.started)}" if r.started else "",
                                                    f"progress {r.progress}" if r.progress else "") if x))
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
        """Give the run names their whole width where the window allows: hide the start time first, then show the
        progress as a percentage ('24 / 24 (100%)' → '100%', the steps in its tooltip); a name is elided only when
        even then it does not fit (NAME_MIN_PX at least)."""
        def width(col: int) -> int:
            return max(self.header().sectionSizeHint(col), self.sizeHintForColumn(col))

        items = [self.topLevelItem(i) for i in range(self.topLevelItemCount())]
        names = max((self.fontMetrics().horizontalAdvance(it.text(0)) + 16 for it in items), default=NAME_MIN_PX)
        self._short_progress(items, False)
        self.setColumnHidden(PROGRESS, False)
        room = self.viewport().width() - max(NAME_MIN_PX, names) - width(1) - width(PROGRESS)
        if room < 0:
            self._short_progress(items, True)
            room = self.viewport().width() - max(NAME_MIN_PX, names) - width(1) - width(PROGRESS)
        if room < 0:  # the selected run's progress is on its dashboard; every row's is in its name's tooltip
            self.setColumnHidden(PROGRESS, True)
            room += width(PROGRESS)
        self.setColumnHidden(STARTED, room < width(STARTED))

    @staticmethod
    def _short_progress(items: list, short: bool) -> None:
        for it in items:
            full = it.data(PROGRESS, QtCore.Qt.UserRole) or ""
            text = full.rsplit("(", 1)[-1].rstrip(")") if short and "(" in full else full
            if it.text(PROGRESS) != text:
                it.setText(PROGRESS, text)

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
