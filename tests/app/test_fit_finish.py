"""Issue 29's fit-and-finish findings in the app (items 2 and 7), each with real widgets offscreen."""
from __future__ import annotations

import json
import shutil

import pytest
from conftest import FIXTURES

from app.ops.hardware_feed import HardwareMonitor
from app.views.wizard.wizard import SetupWizard
from trainer.core.paths import MODELS_DIR

NO_GPU = str(FIXTURES / "hardware" / "no_gpu.jsonl")
LAPTOP = str(FIXTURES / "hardware" / "rtx4090_laptop_16gb.jsonl")


def _wizard(qtbot, hardware: str = NO_GPU) -> SetupWizard:
    hw = HardwareMonitor(hardware)
    hw.start()
    wiz = SetupWizard(hw)
    qtbot.addWidget(wiz)
    wiz.show()
    qtbot.waitUntil(lambda: hw.latest is not None, timeout=5000)
    return wiz


def _facts(qtbot, wiz, text: str, wait_for: str) -> str:
    wiz.model.source.setText(text)
    qtbot.waitUntil(lambda: wait_for in wiz.model.facts.text(), timeout=20000)
    return wiz.model.facts.text()


def test_a_local_model_folder_is_a_folder_and_a_missing_one_says_so_in_the_users_terms(qtbot, tmp_path):
    wiz = _wizard(qtbot)
    wiz.next()
    folder = tmp_path / "models" / "my-model"
    folder.mkdir(parents=True)
    shutil.copy(MODELS_DIR / "smollm-135m.json", folder / "config.json")
    facts = _facts(qtbot, wiz, str(folder), "Here:")
    assert "A folder on this computer" in facts and str(folder) in facts
    assert "not downloaded" not in facts and "Download" not in facts
    missing = _facts(qtbot, wiz, str(tmp_path / "nowhere" / "model"), "not found")
    assert f"model folder not found: {tmp_path / 'nowhere' / 'model'}" in missing
    assert "resources" not in missing and "Hugging Face cache" not in missing and "not downloaded" not in missing
    bare = tmp_path / "empty"
    bare.mkdir()
    assert "has no config.json" in _facts(qtbot, wiz, str(bare), "config.json")


def test_the_model_page_rejudges_after_a_change_on_a_later_page(qtbot):
    wiz = _wizard(qtbot, LAPTOP)
    wiz.next()
    wiz.model.use_architecture("llama-3.2-1b")
    qtbot.waitUntil(lambda: "full: fits" in wiz.model.facts.text(), timeout=20000)
    wiz.next(), wiz.next()
    # Advanced settings on the Method page that the full fine-tune's verdict depends on
    wiz.state.update({"speed.gradient_checkpointing": False, "speed.activation_offload": False,
                      "speed.chunked_loss": False, "deepspeed.enabled": False})
    wiz.back(), wiz.back()
    assert wiz.currentPage() is wiz.model
    qtbot.waitUntil(lambda: "full: does not fit" in wiz.model.facts.text(), timeout=20000)


def _data_page(qtbot, tmp_path, rows: list[dict]):
    from app.views.wizard.page_data import DataPage
    from app.views.wizard.state import WizardState

    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    state = WizardState(hardware=None)
    state.update({"model.source": "demo-tiny-llama", "data.path": str(path), "data.seq_len": 2048})
    page = DataPage(state)
    qtbot.addWidget(page)
    page.resize(800, 520)
    page.show()
    page._cancel_report()
    page._start_report = lambda: None  # these tests look at the page, not at the data command (tested apart)
    page.initializePage()
    return page


def test_a_long_data_error_is_shown_whole_not_cut_to_one_line(qtbot, tmp_path):
    page = _data_page(qtbot, tmp_path, [{"messages": [{"role": "user", "content": "hi"}]}])
    qtbot.waitUntil(lambda: "no assistant turn" in page.stats.text(), timeout=20000)
    qtbot.wait(50)
    lines = page.stats.height() / page.stats.fontMetrics().lineSpacing()
    assert page.stats.wordWrap() and lines >= 2.5, lines  # the whole message, on as many lines as it needs
    assert page.stats.text().endswith("set data.record_format</span>")


def test_records_show_json_not_python_reprs(qtbot, tmp_path):
    chat = {"messages": [{"role": "user", "content": "Where?"}, {"role": "assistant", "content": "Here."}],
            "tags": None, "ok": True}
    page = _data_page(qtbot, tmp_path, [chat])
    qtbot.waitUntil(lambda: page.preview.rowCount() == 1, timeout=20000)
    cells = {page.preview.horizontalHeaderItem(j).text(): page.preview.item(0, j).text()
             for j in range(page.preview.columnCount())}
    assert cells["messages"].startswith('[{"role": "user", "content": "Where?"}')
    assert (cells["tags"], cells["ok"]) == ("null", "true")


def test_a_histogram_of_one_length_is_visible_and_the_renders_secrets_are_said(qtbot, tmp_path):
    page = _data_page(qtbot, tmp_path, [{"text": "same"}] * 3)
    report = {"format": "chat", "records": 40, "seq_len": 2048, "packing": True, "examples": [],
              "tokens": {"median": 40, "p95": 40, "max": 40, "truncated_fraction": 0.0, "per_epoch": 1600,
                         "trained": 400},
              "histogram": {"edges": [39.5, 40.5], "counts": [40]},  # what numpy gives for one length
              "system_message": {"setting": "auto", "template_has_system_role": False, "action": "merged"},
              "empty_think_block": True}
    page.show_report(report)
    (x0,), (x1,) = page.bars.opts["x0"], page.bars.opts["x1"]
    (left, right), _ = page.histogram.viewRange()
    assert x0 < 40 < x1 and (x1 - x0) / (right - left) >= 1 / 61  # a bar, not a hairline on a 2,048-token axis
    assert right >= 2048 * 1.04 and left == 0  # the seq_len line is in view
    words = page.tokens.text()
    assert "start of the first user turn" in words and "empty reasoning block" in words


@pytest.mark.slow  # the data command in a child process
def test_a_gsm8k_file_can_be_trained_as_pairs_and_the_data_page_shows_the_question_masked(qtbot, tmp_path, monkeypatch):
    """Issue 29 item 5 on the Data page: question/answer records are a prompt and its answer; a GSM8K file offers SFT
    beside GRPO (nothing chosen for the user), and SFT's report masks the question and trains the worked answer."""
    from app.views.wizard.page_data import DataPage
    from app.views.wizard.state import WizardState

    monkeypatch.setenv("TRAINPILOT_CACHE", str(tmp_path / "cache"))
    rows = [{"question": f"What is {i} + {i}?", "answer": f"Add them: {i} + {i} = {2 * i}.\\n#### {2 * i}"}
            for i in range(8)]
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    state = WizardState(hardware=None)
    state.update({"model.source": "demo-tiny-llama", "data.path": str(path), "data.seq_len": 128})
    page = DataPage(state)
    qtbot.addWidget(page)
    page.show()
    page.initializePage()
    qtbot.waitUntil(lambda: not page.objective_row.isHidden(), timeout=20000)
    assert [page.objective.itemData(i) for i in range(page.objective.count())] == [None, "sft", "grpo"]
    assert not page.isComplete() and page.report is None
    page.objective.setCurrentIndex(1)
    page.objective.activated.emit(1)
    assert state.values["training.objective"] == "sft" and "training.objective" in state.explicit and page.isComplete()
    qtbot.waitUntil(lambda: page.report is not None or "unavailable" in page.tokens.text(), timeout=240000)
    assert page.report is not None, page.tokens.text()
    segments = page.report["examples"][0]["segments"]
    assert page.report["format"] == "prompt_response"
    assert any(not s["trained"] and "What is 0 + 0?" in s["text"] for s in segments)
    assert any(s["trained"] and "#### 0" in s["text"] for s in segments)
    assert not any(s["trained"] and "What is" in s["text"] for s in segments)
