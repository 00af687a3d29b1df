"""The wizard's data page: detected format and true count (light scan), then the real ``trainpilot-cli data
--json`` in a child process: rendered examples (trained highlighted, masked greyed), histogram with the
seq_len line, truncated share. The GUI process never imports torch for it."""
from __future__ import annotations

import json

import pytest
from PySide6 import QtCore

from app.views.wizard.page_data import MASKED_STYLE, TRAINED_STYLE, DataPage
from app.views.wizard.state import WizardState

CHAT = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where is the cat?"},
                     {"role": "assistant", "content": "Near the river."}, {"role": "user", "content": "And the dog?"},
                     {"role": "assistant", "content": "In the park."}]}


@pytest.mark.slow  # a child process or a model load: seconds (pytest -m 'not slow' stays under 4 min)
def test_data_page_shows_format_examples_histogram_and_truncation(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINPILOT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(CHAT) + "\n" for _ in range(7)) + json.dumps({"messages": CHAT["messages"][1:3]}) + "\n")
    state = WizardState(hardware=None)
    state.update({"model.source": "demo-tiny-llama", "data.path": str(data), "data.seq_len": 40,
                         "device": "cpu"})
    page = DataPage(state)
    qtbot.addWidget(page)
    page.show()
    page.initializePage()
    qtbot.waitUntil(lambda: "8 records" in page.stats.text(), timeout=20000)
    assert "chat" in page.stats.text() and page.preview.rowCount() == 5
    qtbot.waitUntil(lambda: page.report is not None or "unavailable" in page.tokens.text(), timeout=240000)
    assert page.report is not None, page.tokens.text()
    assert page.report["format"] == "chat" and page.report["records"] == 8
    html = page.examples.toHtml()
    assert "Near the river." in html and "Where is the cat?" in html
    assert page.examples.toPlainText().count("Example") == 3
    text = page.report["examples"][0]["segments"]
    assert any(s["trained"] and "Near the river." in s["text"] for s in text)
    assert any(not s["trained"] and "Where is the cat?" in s["text"] for s in text)
    from app.views.wizard.page_data import examples_html

    rendered = examples_html(page.report["examples"][:1])
    assert f"<span style='{TRAINED_STYLE}'>Near the river." in rendered
    assert f"<span style='{MASKED_STYLE}'>" in rendered and "Where is the cat?" in rendered
    assert page.bars is not None and sum(page.bars.opts["height"]) == 8
    assert page.seq_line.value() == 40 and page.seq_line.scene() is not None
    assert "longer than seq_len 40" in page.tokens.text() and "%" in page.tokens.text()

    other = tmp_path / "text.jsonl"  # another file: the first file's examples must not stay on screen
    other.write_text("".join(json.dumps({"text": f"record {i} of the other file"}) + "\n" for i in range(3)))
    page.path.setText(str(other))
    page.path.editingFinished.emit()  # as when the user leaves the field
    assert page.report is None and page.bars is None and "Near the river." not in page.examples.toHtml()
    qtbot.waitUntil(lambda: page.report is not None or "unavailable" in page.tokens.text(), timeout=240000)
    assert page.report is not None and "the other file" in page.examples.toPlainText()


def test_data_page_reports_a_bad_record_without_a_traceback(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINPILOT_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps(CHAT) + "\n" + json.dumps({"messages": []}) + "\n")
    state = WizardState(hardware=None)
    state.update({"model.source": "demo-tiny-llama", "data.path": str(data)})
    page = DataPage(state)
    qtbot.addWidget(page)
    page.initializePage()
    qtbot.waitUntil(lambda: "line 2" in page.stats.text(), timeout=20000)
    assert "messages" in page.stats.text() and "empty" in page.stats.text()


def test_a_400000_record_file_shows_its_true_count(qtbot, tmp_path, monkeypatch):
    """Issue 12: the count is the file's, not a sampling limit (the light scan reads every line)."""
    monkeypatch.setenv("TRAINPILOT_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "big.jsonl"
    data.write_text("".join(f'{{"text": "record {i}"}}\n' for i in range(400_000)))
    state = WizardState(hardware=None)
    state.update({"model.source": "demo-tiny-llama", "data.path": str(data), "data.seq_len": 64,
                         "device": "cpu"})
    page = DataPage(state)
    qtbot.addWidget(page)
    page.show()
    page._start_report = lambda: None  # the token report is the other test's; this one is about the count
    page.initializePage()
    qtbot.waitUntil(lambda: "records" in page.stats.text() and "Reading" not in page.stats.text(), timeout=120000)
    assert "400,000 records" in page.stats.text(), page.stats.text()


PAIRS = [{"prompt": f"Question {i}?", "chosen": f"Good answer {i}.", "rejected": f"Bad answer {i}."} for i in range(6)]
KTO = [{"prompt": f"Question {i}?", "completion": f"Answer {i}.", "label": i % 2 == 0} for i in range(6)]


def _page(qtbot, state, report: bool = False) -> DataPage:
    page = DataPage(state)
    qtbot.addWidget(page)
    page.show()
    if not report:
        page._start_report = lambda: None  # the token report runs in its own (slow) test
    return page


def _show(qtbot, page, path) -> None:
    page.path.setText(str(path))
    qtbot.keyClick(page.path, QtCore.Qt.Key_Return)
    qtbot.waitUntil(lambda: "records" in page.stats.text() and "Reading" not in page.stats.text(), timeout=20000)


def test_the_objective_is_chosen_on_the_data_page_for_preference_and_kto_data(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINPILOT_CACHE", str(tmp_path / "cache"))
    pairs, kto, text = tmp_path / "pairs.jsonl", tmp_path / "kto.jsonl", tmp_path / "text.jsonl"
    pairs.write_text("".join(json.dumps(r) + "\n" for r in PAIRS))
    kto.write_text("".join(json.dumps(r) + "\n" for r in KTO))
    text.write_text("".join(json.dumps({"text": f"record {i}"}) + "\n" for i in range(4)))
    state = WizardState(hardware=None)
    state.update({"model.source": "demo-tiny-llama", "device": "cpu"})
    page = _page(qtbot, state)
    _show(qtbot, page, pairs)
    # Preference pairs: the objective is asked for here, nothing is chosen for the user.
    assert page.objective_row.isVisible() and state.values["training.objective"] == "sft"
    choices = [page.objective.itemData(i) for i in range(page.objective.count())]
    assert choices == [None, "dpo", "orpo"] and "choose one" in page.objective_note.text()
    page.objective.setCurrentIndex(page.objective.findData("orpo"))
    page.objective.activated.emit(page.objective.currentIndex())  # as a user's pick
    assert state.values["training.objective"] == "orpo" and state.config().training.objective == "orpo"
    assert [page.objective.itemData(i) for i in range(page.objective.count())] == ["dpo", "orpo"]
    assert page.objective_note.text() == ""
    # KTO records read only with KTO: nothing to choose (walkthrough 8: "choose one" of one, Next disabled); the
    # ORPO chosen above is not kept silently: the row says what changed.
    _show(qtbot, page, kto)
    assert [page.objective.itemData(i) for i in range(page.objective.count())] == ["kto"]
    assert state.values["training.objective"] == "kto" and state.config().training.objective == "kto"
    assert "ORPO was for the previous file" in page.objective_note.text() and page.isComplete()
    # Plain text after the KTO file: SFT, said so, Next enabled; the same file again: no row.
    _show(qtbot, page, text)
    assert page.objective_row.isVisible() and [page.objective.itemData(i) for i in range(page.objective.count())] == ["sft"]
    assert state.values["training.objective"] == "sft" and "choose" not in page.objective_note.text()
    assert "KTO was for the previous file" in page.objective_note.text() and page.isComplete()
    _show(qtbot, page, text)
    assert not page.objective_row.isVisible() and page.isComplete()


def test_a_typed_path_drops_the_last_files_numbers_and_is_read_when_typing_pauses(qtbot, tmp_path, monkeypatch):
    """Walkthrough 8: a typed data path showed the previous file's statistics until Enter."""
    monkeypatch.setenv("TRAINPILOT_CACHE", str(tmp_path / "cache"))
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("".join(json.dumps({"text": f"record {i}"}) + "\n" for i in range(8)))
    second.write_text("".join(json.dumps({"text": f"record {i}"}) + "\n" for i in range(3)))
    state = WizardState(hardware=None)
    state.update({"model.source": "demo-tiny-llama", "device": "cpu"})
    page = _page(qtbot, state)
    _show(qtbot, page, first)
    assert "8 records" in page.stats.text() and page.preview.rowCount() == 5
    page.path.setFocus()
    page.path.selectAll()
    qtbot.keyClicks(page.path, str(second))  # no Enter, focus stays
    assert "8 records" not in page.stats.text() and page.preview.rowCount() == 0
    qtbot.waitUntil(lambda: "3 records" in page.stats.text(), timeout=20000)
    assert state.values["data.path"] == str(second) and page.path.hasFocus()


def test_data_errors_name_the_pages_controls_and_the_skip_box_skips(qtbot, tmp_path, monkeypatch):
    """Walkthrough 8: "set data.skip_bad_lines: true" with no such control on the page; the page has the box now."""
    monkeypatch.setenv("TRAINPILOT_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "bad.jsonl"
    data.write_text("".join(json.dumps({"text": f"record {i}"}) + "\n" for i in range(4)) + "{not json\n")
    state = WizardState(hardware=None)
    state.update({"model.source": "demo-tiny-llama", "device": "cpu"})
    page = _page(qtbot, state)
    page.path.setText(str(data))
    page.path.editingFinished.emit()
    qtbot.waitUntil(lambda: "line 5" in page.stats.text(), timeout=20000)
    text = page.stats.text()
    assert "data." not in text and page.skip_bad.text() in text, text
    page.skip_bad.click()
    qtbot.waitUntil(lambda: "4 records" in page.stats.text(), timeout=20000)
    assert "1 unreadable line skipped" in page.stats.text() and state.config().data.skip_bad_lines is True


@pytest.mark.slow  # the data command imports torch in a child process
def test_preference_examples_keep_prompt_and_answers_apart_with_a_legend(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINPILOT_CACHE", str(tmp_path / "cache"))
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(r) + "\n" for r in PAIRS))
    state = WizardState(hardware=None)
    state.update({"model.source": "demo-tiny-llama", "device": "cpu", "training.objective": "dpo",
                         "data.seq_len": 64})
    page = _page(qtbot, state, report=True)
    _show(qtbot, page, pairs)
    qtbot.waitUntil(lambda: page.report is not None or "unavailable" in page.tokens.text(), timeout=240000)
    assert page.report is not None, page.tokens.text()
    text = page.examples.toPlainText()
    assert "Colours:" in text and "chosen answer: trained towards" in text and "rejected answer" in text
    assert "prompt\nQuestion 0?" in text.replace("\n\n", "\n") and "chosen\nGood answer 0." in text.replace("\n\n", "\n")
    assert "rejected\nBad answer 0." in text.replace("\n\n", "\n")
    assert "Tokens per prompt + longer answer" in page.tokens.text() and "median" in page.tokens.text()


@pytest.mark.slow  # the data command imports torch in a child process
def test_the_first_examples_show_while_every_record_is_still_tokenized(qtbot, tmp_path, monkeypatch):
    """Walkthrough 7: 400,000 records showed no example for 3 min 50 s, the first three known after 4 s. The examples
    show as soon as the child has rendered them; the statistics follow."""
    monkeypatch.setenv("TRAINPILOT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    data = tmp_path / "big.jsonl"
    data.write_text("".join(f'{{"text": "record {i} of a long file"}}\n' for i in range(150_000)))
    state = WizardState(hardware=None)
    state.update({"model.source": "demo-tiny-llama", "data.path": str(data), "data.seq_len": 64, "device": "cpu"})
    page = _page(qtbot, state, report=True)
    page.initializePage()
    qtbot.waitUntil(lambda: "record 2 of a long file" in page.examples.toPlainText()
                    or "unavailable" in page.tokens.text(), timeout=240000)
    assert page.report is None, "the examples came only with the statistics"
    assert "record 0 of a long file" in page.examples.toPlainText() and "statistics follow" in page.tokens.text()
    page.path.setText(str(tmp_path / "other.jsonl"))  # another file: the child is stopped, its examples go
    qtbot.keyClick(page.path, QtCore.Qt.Key_Return)
    assert page._data_job is None and "record 0" not in page.examples.toPlainText()
