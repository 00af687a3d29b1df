"""The hardware header: GPU name, laptop/desktop badge, VRAM, driver, temperature (a view)."""
from __future__ import annotations

from PySide6 import QtWidgets

from app.ops.hardware_feed import describe


class HardwareHeader(QtWidgets.QFrame):
    """One line of hardware facts; ``show_snapshot(snap)`` binds a MachineSnapshot."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setFrameShape(QtWidgets.QFrame.StyledPanel)
        self.name = QtWidgets.QLabel("Detecting GPU…")
        self.name.setStyleSheet("font-weight: bold; font-size: 14px")
        self.badge = QtWidgets.QLabel("")
        self.badge.setStyleSheet("background:#444; color:white; border-radius:4px; padding:1px 6px")
        self.vram, self.driver, self.temp = QtWidgets.QLabel(), QtWidgets.QLabel(), QtWidgets.QLabel()
        for w in (self.vram, self.driver):  # on a narrow window these give way first, whole (full text in the tooltip)
            w.setSizePolicy(QtWidgets.QSizePolicy.Ignored, QtWidgets.QSizePolicy.Preferred)
        self.facts: dict = {}
        lay = QtWidgets.QHBoxLayout(self)
        for w, stretch in ((self.name, 0), (self.badge, 0), (self.vram, 3), (self.driver, 2)):
            lay.addWidget(w, stretch)
        lay.addStretch(1)
        lay.addWidget(self.temp)

    def show_snapshot(self, snap) -> None:
        """Show the facts of ``snap``."""
        facts = describe(snap)
        self.name.setText(facts["name"])
        self.badge.setText(facts["badge"])
        self.vram.setText(facts["vram"])
        self.driver.setText(facts["driver"])
        self.vram.setToolTip(facts["vram"])
        self.driver.setToolTip(facts["driver"])
        self.temp.setText(facts["temperature"])
        self.facts = facts
        self._fit()

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._fit()

    def _fit(self) -> None:
        """Show the VRAM and driver facts whole or not at all (a narrow window cut "11.9 GiB in use" mid-word):
        the driver goes first, then "… in use"; the tooltips keep everything."""
        if not self.facts:
            return
        fm, gap = self.fontMetrics(), 24
        room = self.width() - self.name.sizeHint().width() - self.badge.sizeHint().width() - \
            self.temp.sizeHint().width() - 4 * gap
        vram, driver = self.facts["vram"], self.facts["driver"]
        short = vram.split(",")[0]
        if fm.horizontalAdvance(vram) + fm.horizontalAdvance(driver) + gap <= room:
            shown = (vram, driver)
        elif fm.horizontalAdvance(vram) <= room:
            shown = (vram, "")
        else:
            shown = (short if fm.horizontalAdvance(short) <= room else "", "")
        for label, text in zip((self.vram, self.driver), shown):
            if label.text() != text:
                label.setText(text)
            label.setVisible(bool(text))

    def show_problem(self, text: str) -> None:
        """Show why hardware facts are missing."""
        self.name.setText(text)
        self.badge.setText("?")
