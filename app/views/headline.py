"""The dashboard's top line: the headline (the run's state and numbers, on two fixed lines) and the progress strip.
Both keep a fixed size: a layout change would re-render every axis of the plots below them."""
from __future__ import annotations

from PySide6 import QtCore, QtGui, QtWidgets


class ProgressStrip(QtWidgets.QWidget):
    """'step / total' as a filled bar. Painted by us: QProgressBar.setValue repaints synchronously,
    which redraws the plots beneath it in the same call (measured: 0.24 s with a day of data)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.step, self.total = 0, 0
        self.setFixedSize(150, 18)

    def set_progress(self, step: int, total: int) -> None:
        """Show ``step`` of ``total`` (schedules a repaint; never paints now)."""
        self.step, self.total = min(step, total), total
        self.setToolTip(f"{self.step:,} of {self.total:,} steps")
        self.update()

    def paintEvent(self, _event) -> None:
        p = QtGui.QPainter(self)
        r = self.rect().adjusted(0, 0, -1, -1)
        p.fillRect(r, QtGui.QColor("#eee"))
        if self.total:
            p.fillRect(QtCore.QRectF(r.left(), r.top(), r.width() * self.step / self.total, r.height()),
                       QtGui.QColor("#6baed6"))
        p.setPen(QtGui.QColor("#888"))
        p.drawRect(r)
        p.setPen(QtGui.QColor("#222"))
        pct = f" ({self.step / self.total:.0%})" if self.total else ""
        p.drawText(r, QtCore.Qt.AlignCenter, f"{self.step:,} / {self.total:,}{pct}")
        p.end()


class Headline(QtWidgets.QLabel):
    """The dashboard's top line: ``text()`` is the whole headline (and its tooltip); it is painted on at most two
    lines of the label's fixed height, whole parts (split at " · ") dropped from the end, with "…", until it fits:
    at 800×600 nothing is cut mid-word and the state always shows."""

    def setText(self, text: str) -> None:  # noqa: N802 (Qt's name)
        super().setText(text)
        self.setToolTip(text)

    def shown_text(self) -> str:
        """What fits in the label's rectangle (whole parts, "…" when some were dropped)."""
        parts, rect, fm = self.text().split(" · "), self.contentsRect(), self.fontMetrics()
        for n in range(len(parts), 0, -1):
            text = " · ".join(parts[:n]) + (" · …" if n < len(parts) else "")
            need = fm.boundingRect(QtCore.QRect(0, 0, max(rect.width(), 1), 10_000), QtCore.Qt.TextWordWrap, text)
            if need.height() <= rect.height():
                return text
        return parts[0]

    def paintEvent(self, _event) -> None:  # noqa: N802
        p = QtGui.QPainter(self)
        p.setPen(self.palette().color(QtGui.QPalette.WindowText))
        p.drawText(self.contentsRect(), QtCore.Qt.TextWordWrap | QtCore.Qt.AlignVCenter | QtCore.Qt.AlignLeft,
                   self.shown_text())
        p.end()
