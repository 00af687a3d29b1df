"""Issue 29 item 1: what is typed is what is saved, keystroke by keystroke, in every number field of the wizard.

QWizard hides and re-shows its current page whenever a page's completeness changes, and a Qt spin box re-formats
its text on every show: select 1.000 in a reward's weight, type 0.5, and "0" became "0.000" — the "." and "5" were
refused and a reward got weight 0. Keys go through Qt as real key events (QTest), one at a time."""
from __future__ import annotations

import pytest
from conftest import FIXTURES, started_wizard
from PySide6 import QtCore, QtWidgets
from PySide6.QtTest import QTest

from app.views.wizard.numbers import DoubleSpinBox, SpinBox
from app.views.wizard.wizard import SetupWizard

NO_GPU = str(FIXTURES / "hardware" / "no_gpu.jsonl")
TYPED = {SpinBox: ("99999999", "512"), DoubleSpinBox: ("0.5", "0.25", "1.5")}


def _wizard(qtbot) -> SetupWizard:
    return started_wizard(qtbot, NO_GPU)


def _type(qtbot, wiz, box, text: str, reshow: bool) -> None:
    """Select the box's text and type ``text`` key by key; after each key the text shown is what was typed so far
    and the config holds that number."""
    box.setFocus()
    box.lineEdit().selectAll()
    key = box.objectName()
    for i in range(1, len(text) + 1):
        QTest.keyClick(box.lineEdit(), text[i - 1])
        if reshow:  # what the wizard does when any page's completeness changes: hide and show the page
            wiz.currentPage().completeChanged.emit()
        qtbot.wait(30)
        assert box.lineEdit().text() == text[:i], (key, text[:i], box.lineEdit().text())
        if key in wiz.state.values and text[:i].rstrip(".").replace(".", "", 1).isdigit():
            assert wiz.state.values[key] == float(text[:i]), (key, text[:i], wiz.state.values[key])


def test_a_reward_weight_is_saved_as_typed_when_the_page_re_shows(qtbot):
    wiz = _wizard(qtbot)
    wiz.state.set("training.objective", "grpo")
    wiz.next(), wiz.next(), wiz.next()
    page = wiz.rewards
    assert wiz.currentPage() is page
    tick = page.ticks["exact_answer"]
    qtbot.mouseClick(tick, QtCore.Qt.LeftButton, pos=QtCore.QPoint(6, tick.height() // 2))  # the only reward: 0 makes the page incomplete
    weight = page.weights["exact_answer"]
    for text in ("0.5", "0.25", "1.5"):  # the three: 0.000, 0.200 and 1.000 were saved
        _type(qtbot, wiz, weight, text, reshow=False)
        assert wiz.state.values["rewards.exact_answer"] == float(text)
    assert wiz.state.config().rewards.exact_answer == 1.5


@pytest.mark.slow  # every field of every page, key by key: ~15 s
def test_every_number_field_of_the_wizard_keeps_what_is_typed(qtbot):
    wiz = _wizard(qtbot)
    boxes = wiz.findChildren(QtWidgets.QAbstractSpinBox)
    assert boxes and all(type(b) in TYPED for b in boxes), [type(b).__name__ for b in boxes]  # no plain Qt box left
    keys = {b.objectName() for b in boxes}
    assert {"data.seq_len", "training.effective_batch_size", "rewards.length_target", "rewards.exact_answer",
            "rewards.numeric_answer", "rewards.format", "rewards.json_valid", "rewards.length_penalty"} <= keys
    wiz.state.set("training.objective", "grpo")
    typed = 0
    while True:
        page = wiz.currentPage()
        for box in page.findChildren(QtWidgets.QAbstractSpinBox):
            tick = next((t for n, t in getattr(page, "ticks", {}).items() if page.weights[n] is box), None)
            if tick is not None and not tick.isChecked():
                qtbot.mouseClick(tick, QtCore.Qt.LeftButton, pos=QtCore.QPoint(6, tick.height() // 2))  # its box
            # the Preview's counts are not config values: 1–64 prompts/answers, typed within that
            for text in TYPED[type(box)] if box.objectName() else ("12", "3"):
                _type(qtbot, wiz, box, text, reshow=True)
                typed += 1
        if page is wiz.plan:
            break
        wiz.next()
    assert typed >= 2 * len(boxes)
    # 99999999 tokens is kept as typed (not 999999) and refused beside the field by the model's limit
    wiz.state.set("data.seq_len", 99999999)
    qtbot.waitUntil(lambda: "99999999 is longer" in wiz.plan.seq_len_error.text(), timeout=20000)
    assert wiz.plan.seq_len.value() == 99999999 and wiz.plan.seq_len_error.isVisible()
