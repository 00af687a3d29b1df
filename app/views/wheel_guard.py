"""The mouse wheel scrolls pages; it never changes a setting the user did not pick (issue 45).

Qt's combo boxes, spin boxes and sliders take the wheel by default: scrolling the Method page over Advanced settings
turned the Plan goal combo under the pointer (fastest → most_headroom, then a re-plan), with no sign but the combo's
text. Here, app-wide and installed once (``install``):

- every such widget gets ``Qt.StrongFocus`` when it is polished (a click or Tab focuses it, the wheel does not: Qt's
  default ``WheelFocus`` would focus it on the first wheel turn and let that turn change it);
- a wheel over one that does not have the focus goes to the scroll area around it (the page scrolls), or, where there
  is none, to nobody: the widget's value never moves. A focused one (clicked, tabbed into) takes the wheel as usual.

Scroll bars are sliders too, and are left alone: they are what scrolls.
"""
from __future__ import annotations

from PySide6 import QtCore, QtWidgets

GUARDED = (QtWidgets.QComboBox, QtWidgets.QAbstractSpinBox, QtWidgets.QAbstractSlider)
_WHEEL, _POLISH = QtCore.QEvent.Type.Wheel, QtCore.QEvent.Type.Polish


def guarded(obj) -> bool:
    """True for a widget whose value a wheel turn would change (combo box, spin box, slider; not a scroll bar)."""
    return isinstance(obj, GUARDED) and not isinstance(obj, QtWidgets.QScrollBar)


class WheelGuard(QtCore.QObject):
    """The application's event filter (see the module docstring)."""

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 (Qt's name)
        kind = event.type()
        if kind == _WHEEL:
            if not guarded(obj) or obj.hasFocus():
                return False
            area = scroll_area_of(obj)
            if area is not None:
                QtCore.QCoreApplication.sendEvent(area.viewport(), event)
            event.accept()  # taken here: neither the widget nor (for Qt's own propagation) its parents change
            return True
        if kind == _POLISH and guarded(obj) and obj.focusPolicy() == QtCore.Qt.WheelFocus:
            obj.setFocusPolicy(QtCore.Qt.StrongFocus)
        return False


def scroll_area_of(widget: QtWidgets.QWidget) -> QtWidgets.QAbstractScrollArea | None:
    """The nearest scroll area ``widget`` sits in (a combo box's own list is not one it sits in), or None."""
    parent = widget.parentWidget()
    while parent is not None:
        if isinstance(parent, QtWidgets.QAbstractScrollArea) and not guarded(parent):
            return parent
        parent = parent.parentWidget()
    return None


def install(app: QtWidgets.QApplication | None = None) -> WheelGuard | None:
    """Install the guard on ``app`` (default: the running QApplication) once; later calls return the same guard.
    None when there is no application yet."""
    app = app or QtWidgets.QApplication.instance()
    if app is None:
        return None
    guard = app.findChild(WheelGuard, "wheel_guard")
    if guard is None:
        guard = WheelGuard(app)
        guard.setObjectName("wheel_guard")
        app.installEventFilter(guard)
        for widget in app.allWidgets():  # widgets made before the guard (already polished)
            if guarded(widget) and widget.focusPolicy() == QtCore.Qt.WheelFocus:
                widget.setFocusPolicy(QtCore.Qt.StrongFocus)
    return guard
