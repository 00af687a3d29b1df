"""The mouse wheel scrolls pages; it never changes a setting the user did not pick (issue 45).

Qt's combo boxes, spin boxes and sliders take the wheel by default: scrolling the Method page over Advanced settings
turned the Plan goal combo under the pointer (fastest → most_headroom, then a re-plan), with no sign but the combo's
text. The app's own widgets (``ComboBox`` here, the number fields of ``app.views.wizard.numbers``) carry
``WheelGuarded``:

- they take ``Qt.StrongFocus`` (a click or Tab focuses them, the wheel does not: Qt's default ``WheelFocus`` would
  focus one on the first wheel turn and let that turn change it);
- a wheel over one that does not have the focus goes to the scroll area around it (the page scrolls), or, where there
  is none, on to the parents as an ignored event: the widget's value never moves. A focused one (clicked, tabbed
  into) takes the wheel as usual. The scroll area is sent the event itself, not left to Qt's propagation: Qt passes
  an ignored wheel on to the parents only when it came from the window system, not when sent by code.

The guard lives on the widgets, not as an application-wide event filter: such a filter runs Python for every event
of every widget, and with a background thread busy in Python (a data scan) each event waited for the interpreter
lock, so the event loop fell behind what the thread posted (a GUI test waited 12 minutes on CI). No module of app/
builds a bare QComboBox, QSpinBox, QDoubleSpinBox or QSlider (tests/app/test_wheel.py holds it).
"""
from __future__ import annotations

from PySide6 import QtCore, QtWidgets


class WheelGuarded:
    """Mixin for a QComboBox, QAbstractSpinBox or QAbstractSlider: the wheel changes it only while it has the focus."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.setFocusPolicy(QtCore.Qt.StrongFocus)

    def wheelEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        if self.hasFocus():
            super().wheelEvent(event)
            return
        area = scroll_area_of(self)
        if area is None:
            event.ignore()
            return
        QtCore.QCoreApplication.sendEvent(area.viewport(), event)
        event.accept()  # taken here: the scroll area scrolled, the parents must not scroll it again


def scroll_area_of(widget: QtWidgets.QWidget) -> QtWidgets.QAbstractScrollArea | None:
    """The nearest scroll area ``widget`` sits in, or None."""
    parent = widget.parentWidget()
    while parent is not None:
        if isinstance(parent, QtWidgets.QAbstractScrollArea):
            return parent
        parent = parent.parentWidget()
    return None


class ComboBox(WheelGuarded, QtWidgets.QComboBox):
    """The app's combo box: the wheel scrolls the page over it unless it was clicked or tabbed into."""


class Slider(WheelGuarded, QtWidgets.QSlider):
    """The app's slider (the wheel rule of ``ComboBox``; scroll bars are not sliders of ours and keep scrolling)."""
