"""The mouse wheel scrolls pages and never changes a setting that was not clicked or focused (issue 45, item 2):
real widgets, real wheel events, the app's own guarded widgets (app/views/wheel_guard.py)."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import FIXTURES, SHOWN_MS, started_wizard
from PySide6 import QtCore, QtGui, QtWidgets

from app.views.wheel_guard import ComboBox, Slider
from app.views.wizard.numbers import DoubleSpinBox, SpinBox

NO_GPU = str(FIXTURES / "hardware" / "no_gpu.jsonl")


def _wheel(widget: QtWidgets.QWidget, down: bool = True) -> None:
    """One notch of the wheel over the middle of ``widget``, delivered as Qt delivers it (an ignored wheel goes on to
    the parents: QApplication.notify propagates it)."""
    pos = QtCore.QPointF(widget.rect().center())
    delta = QtCore.QPoint(0, -120 if down else 120)
    event = QtGui.QWheelEvent(pos, QtCore.QPointF(widget.mapToGlobal(pos.toPoint())), QtCore.QPoint(), delta,
                              QtCore.Qt.NoButton, QtCore.Qt.NoModifier, QtCore.Qt.NoScrollPhase, False)
    QtWidgets.QApplication.sendEvent(widget, event)


def test_the_wheel_over_the_plan_goal_combo_scrolls_the_method_page_and_keeps_the_goal(qtbot):
    wiz = started_wizard(qtbot, NO_GPU)
    wiz.resize(900, 600)
    wiz.next(), wiz.next(), wiz.next()
    page = wiz.plan
    assert wiz.currentPage() is page
    page.advanced_toggle.click()
    combo = page.advanced.editors["plan_goal"]
    assert isinstance(combo, QtWidgets.QComboBox) and combo.currentData() == "fastest"
    bar = page.scroll.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0, timeout=SHOWN_MS)
    page.scroll.ensureWidgetVisible(combo)
    before = bar.value()
    assert before < bar.maximum()  # room to scroll further down
    assert not combo.hasFocus()
    for _ in range(3):
        _wheel(combo)
    assert combo.currentData() == "fastest" and wiz.state.values["plan_goal"] == "fastest"
    assert bar.value() > before  # the page scrolled instead
    assert not combo.hasFocus() and combo.focusPolicy() == QtCore.Qt.StrongFocus  # the wheel does not focus it
    # every combo box and number field of the form is guarded the same way
    for key, editor in page.advanced.editors.items():
        if isinstance(editor, QtWidgets.QComboBox):
            assert editor.focusPolicy() == QtCore.Qt.StrongFocus, key
    for spin in (page.seq_len, page.batch):
        value = spin.value()
        _wheel(spin, down=False)
        assert spin.value() == value and spin.focusPolicy() == QtCore.Qt.StrongFocus


def test_spin_boxes_and_sliders_keep_their_value_and_scroll_bars_still_scroll(qtbot):
    area = QtWidgets.QScrollArea(widgetResizable=True)
    body = QtWidgets.QWidget()
    lay = QtWidgets.QVBoxLayout(body)
    spin, double, slider, combo = SpinBox(0, 100), DoubleSpinBox(0, 100), Slider(QtCore.Qt.Horizontal), ComboBox()
    spin.setValue(50)
    double.setValue(50)
    slider.setRange(0, 100), slider.setValue(50)
    combo.addItems(["a", "b", "c"])
    combo.setCurrentIndex(1)
    for w in (spin, double, slider, combo):
        lay.addWidget(w)
    lay.addSpacing(2000)
    area.setWidget(body)
    area.resize(300, 200)
    qtbot.addWidget(area)
    area.show()
    qtbot.waitExposed(area)
    bar = area.verticalScrollBar()
    for w in (spin, double, slider, combo):
        _wheel(w)
    assert (spin.value(), double.value(), slider.value(), combo.currentIndex()) == (50, 50.0, 50, 1)
    assert bar.value() > 0  # four notches scrolled the page
    moved = bar.value()
    _wheel(bar)  # a scroll bar is a slider too: it is what scrolls, and keeps doing so
    assert bar.value() > moved
    # a widget the user clicked or tabbed into takes the wheel as before
    area.activateWindow()
    qtbot.waitUntil(lambda: area.isActiveWindow(), timeout=SHOWN_MS)
    spin.setFocus()
    qtbot.waitUntil(spin.hasFocus, timeout=SHOWN_MS)
    _wheel(spin, down=False)
    assert spin.value() == 51


BARE = {"QComboBox", "QSpinBox", "QDoubleSpinBox", "QSlider"}


def test_no_module_of_the_app_builds_a_widget_the_wheel_would_change():
    """Every combo box, spin box and slider the app builds is one of the guarded ones (wheel_guard's docstring);
    a bare ``QtWidgets.QComboBox()`` would turn under a scrolling pointer again."""
    app_dir = Path(__file__).resolve().parents[2] / "app"
    found = []
    for path in sorted(app_dir.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in BARE:
                found.append(f"{path.relative_to(app_dir.parent)}:{node.lineno} {node.func.attr}")
    assert not found, f"use app.views.wheel_guard.ComboBox/Slider or app.views.wizard.numbers' spin boxes: {found}"
