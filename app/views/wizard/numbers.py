"""The app's number fields: spin boxes that keep what is typed (and take the wheel only when focused: wheel_guard).

Two things rewrote a number while it was typed (select 1.000, type ``0.5`` → 0.000 saved):

- QWizard hides and re-shows the current page on every ``completeChanged`` (its anti-flicker widget, in
  ``_q_updateButtonStates``), and QAbstractSpinBox re-formats its text on every show: "0" became "0.000",
  and the "." and "5" typed next were refused. ``showEvent`` here puts the text being typed back.
- A range narrower than the schema's refused keystrokes silently (99999999 sequence tokens became 999999).
  The range here is the config field's own (``ge``/``gt``, and int32 or 1e9 at most, beyond any real
  value): the schema and the model judge a value, beside the field, never the widget.

Keyboard tracking stays on: every keystroke that makes a number is that number, saved as typed.
"""
from __future__ import annotations

from PySide6 import QtWidgets

from app.views.wheel_guard import WheelGuarded

INT_MAX = 2**31 - 1      # QSpinBox holds a C int
FLOAT_MAX = 1e9          # far above any weight; the schema says what is too much


def field_minimum(field, default: float = 0) -> float:
    """The lowest value a pydantic field allows a user to type: its ``ge``, or 0 for ``gt=0`` (so "0" is
    typed and saved, and the schema says why it is refused), else ``default``."""
    for meta in getattr(field, "metadata", ()):
        if getattr(meta, "ge", None) is not None:
            return meta.ge
        if getattr(meta, "gt", None) is not None:
            return min(meta.gt, 0)
    return default


class _KeepsTyping:
    """Mixin for QAbstractSpinBox: a re-show while the box is being edited keeps the typed text and cursor."""

    def showEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        edit = self.lineEdit()
        typed = edit.text() if self.hasFocus() else None
        cursor = edit.cursorPosition()
        super().showEvent(event)
        if typed is not None and edit.text() != typed:
            edit.setText(typed)  # the same number (it was the value), in the user's own digits
            edit.setCursorPosition(cursor)


class SpinBox(WheelGuarded, _KeepsTyping, QtWidgets.QSpinBox):
    """An integer field for a config key (``objectName`` is the dotted key, when it has one)."""

    def __init__(self, minimum: int = 0, maximum: int = INT_MAX, key: str = "", tip: str = "", parent=None):
        super().__init__(parent)
        self.setRange(int(minimum), int(maximum))
        self.setObjectName(key)
        self.setToolTip(tip)


class DoubleSpinBox(WheelGuarded, _KeepsTyping, QtWidgets.QDoubleSpinBox):
    """A decimal field for a config key (``objectName`` is the dotted key, when it has one)."""

    def __init__(self, minimum: float = 0.0, maximum: float = FLOAT_MAX, decimals: int = 3, step: float = 0.1,
                 key: str = "", tip: str = "", parent=None):
        super().__init__(parent)
        self.setDecimals(decimals)
        self.setRange(minimum, maximum)
        self.setSingleStep(step)
        self.setObjectName(key)
        self.setToolTip(tip)
