"""The hardware header: GPU name, laptop/desktop badge, VRAM, driver, temperature (a view)."""
from __future__ import annotations

from PySide6 import QtWidgets

from app.hardware import describe


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
        lay = QtWidgets.QHBoxLayout(self)
        for w in (self.name, self.badge, self.vram, self.driver):
            lay.addWidget(w)
        lay.addStretch(1)
        lay.addWidget(self.temp)

    def show_snapshot(self, snap) -> None:
        """Show the facts of ``snap``."""
        facts = describe(snap)
        self.name.setText(facts["name"])
        self.badge.setText(facts["badge"])
        self.vram.setText(facts["vram"])
        self.driver.setText(facts["driver"])
        self.temp.setText(facts["temperature"])

    def show_problem(self, text: str) -> None:
        """Show why hardware facts are missing."""
        self.name.setText(text)
        self.badge.setText("?")
