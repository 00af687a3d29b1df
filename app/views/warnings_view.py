"""The warnings list: each warning's text, and an 'End process' button for the user's own apps."""
from __future__ import annotations

from PySide6 import QtCore, QtWidgets

from app.model.advice import Advice

COLORS = {"error": "#fde2e2", "warning": "#fff4d6", "info": "#e8f1fd"}


class WarningsView(QtWidgets.QScrollArea):
    """Shows a list of Advice; emits ``end_process(pid, name)`` when the user asks to end one."""

    end_process = QtCore.Signal(int, str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWidgetResizable(True)
        self._box = QtWidgets.QWidget()
        self._lay = QtWidgets.QVBoxLayout(self._box)
        self._lay.addStretch(1)
        self.setWidget(self._box)
        self._keys: tuple = ()
        self.items: list[Advice] = []

    def show_advice(self, items: list[Advice]) -> None:
        """Replace the list (rebuilt only when the warnings changed)."""
        keys = tuple((a.key, a.text) for a in items)
        if keys == self._keys:
            return
        self._keys, self.items = keys, list(items)
        while self._lay.count() > 1:
            w = self._lay.takeAt(0).widget()
            if w:
                w.hide()  # out of the layout but painted until the deferred delete: seen as a ghost row
                w.deleteLater()
        if not items:
            self._lay.insertWidget(0, QtWidgets.QLabel("No warnings."))
        for i, a in enumerate(items):
            self._lay.insertWidget(i, self._row(a))

    def _row(self, a: Advice) -> QtWidgets.QWidget:
        row = QtWidgets.QFrame()
        row.setStyleSheet(f"QFrame {{ background: {COLORS.get(a.level, '#eee')}; border-radius: 4px; }}")
        lay = QtWidgets.QHBoxLayout(row)
        label = QtWidgets.QLabel(a.text)
        label.setWordWrap(True)
        label.setTextInteractionFlags(QtCore.Qt.TextSelectableByMouse)
        lay.addWidget(label, 1)
        if a.pid is not None:
            button = QtWidgets.QPushButton(f"End {a.process_name}…")
            button.clicked.connect(lambda _=False, pid=a.pid, name=a.process_name: self.end_process.emit(pid, name))
            lay.addWidget(button)
        return row

    def texts(self) -> list[str]:
        """The warning texts shown (for tests and screen readers)."""
        return [a.text for a in self.items]
