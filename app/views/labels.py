"""A label that wraps and keeps the height its lines need.

A word-wrapped QLabel inside a QWizard page (and some other layouts) is given one line of height: the layout asks
its size hint, not its height for the page's width, so a long error was cut off after one line. This label sets its
minimum height from ``heightForWidth`` whenever its width or text changes."""
from __future__ import annotations

from PySide6 import QtCore, QtWidgets


class WrappedLabel(QtWidgets.QLabel):
    """A word-wrapped, selectable label whose every line shows."""

    def __init__(self, text: str = "", parent=None):
        super().__init__(text, parent)
        self.setWordWrap(True)
        self.setTextInteractionFlags(QtCore.Qt.TextSelectableByMouse | QtCore.Qt.LinksAccessibleByMouse)
        self.setSizePolicy(QtWidgets.QSizePolicy.Preferred, QtWidgets.QSizePolicy.Minimum)

    def setText(self, text: str) -> None:  # noqa: N802 (Qt's name)
        super().setText(text)
        self._fit()

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._fit()

    def _fit(self) -> None:
        width = self.width() if self.width() > 50 else self.sizeHint().width()
        need = self.heightForWidth(width) if self.text() else 0
        if need > 0 and need != self.minimumHeight():
            self.setMinimumHeight(need)
        elif not self.text():
            self.setMinimumHeight(0)
