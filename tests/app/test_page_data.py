"""The wizard's data page: detected format and true count (light scan), then the real ``trainpilot-cli data
--json`` in a child process: rendered examples (trained highlighted, masked greyed), histogram with the
seq_len line, truncated share. The GUI process never imports torch for it."""
from __future__ import annotations

import json

import pytest

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
    page.path.editingFinished.emit()
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
    # KTO records read only with KTO; the ORPO chosen above is not kept silently.
    _show(qtbot, page, kto)
    assert [page.objective.itemData(i) for i in range(page.objective.count())] == [None, "kto"]
    assert state.values["training.objective"] == "orpo" and "KTO" in page.objective_note.text()
    # Plain text with a preference objective left over: SFT is offered; with SFT the row goes away.
    _show(qtbot, page, text)
    assert page.objective_row.isVisible() and page.objective.itemData(1) == "sft"
    page.objective.setCurrentIndex(1)
    page.objective.activated.emit(1)
    assert state.values["training.objective"] == "sft"
    _show(qtbot, page, text)
    assert not page.objective_row.isVisible()


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
