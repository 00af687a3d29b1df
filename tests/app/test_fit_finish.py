"""Issue 29's fit-and-finish findings in the app (items 2 and 7), each with real widgets offscreen."""
from __future__ import annotations

import json
import shutil

import pytest
from conftest import FIXTURES, SHOWN_MS, started_wizard

from app.views.wizard.wizard import SetupWizard
from trainer.core.paths import MODELS_DIR

NO_GPU = str(FIXTURES / "hardware" / "no_gpu.jsonl")
LAPTOP = str(FIXTURES / "hardware" / "rtx4090_laptop_16gb.jsonl")


def _wizard(qtbot, hardware: str = NO_GPU) -> SetupWizard:
    return started_wizard(qtbot, hardware)


def _facts(qtbot, wiz, text: str, wait_for: str) -> str:
    wiz.model.source.setText(text)
    qtbot.waitUntil(lambda: wait_for in wiz.model.facts.text(), timeout=SHOWN_MS)
    return wiz.model.facts.text()


@pytest.mark.slow  # plans and verdicts in the background: 10-30 s
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


@pytest.mark.slow  # plans and verdicts in the background: 10-30 s
def test_the_model_page_rejudges_after_a_change_on_a_later_page(qtbot):
    wiz = _wizard(qtbot, LAPTOP)
    wiz.next()
    wiz.model.use_architecture("llama-3.2-1b")
    qtbot.waitUntil(lambda: "full: fits" in wiz.model.facts.text(), timeout=SHOWN_MS)
    wiz.next(), wiz.next()
    # Advanced settings on the Method page that the full fine-tune's verdict depends on
    wiz.state.update({"speed.gradient_checkpointing": False, "speed.activation_offload": False,
                      "speed.loss_kernel": "hf", "deepspeed.enabled": False})
    wiz.back(), wiz.back()
    assert wiz.currentPage() is wiz.model
    qtbot.waitUntil(lambda: "full: does not fit" in wiz.model.facts.text(), timeout=SHOWN_MS)


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
    qtbot.waitUntil(lambda: "no assistant turn" in page.stats.text(), timeout=SHOWN_MS)
    qtbot.wait(50)
    lines = page.stats.height() / page.stats.fontMetrics().lineSpacing()
    assert page.stats.wordWrap() and lines >= 2.5, lines  # the whole message, on as many lines as it needs
    assert page.stats.text().endswith("set “Record format” (Method page → Advanced settings)</span>")  # its label


def test_records_show_json_not_python_reprs(qtbot, tmp_path):
    chat = {"messages": [{"role": "user", "content": "Where?"}, {"role": "assistant", "content": "Here."}],
            "tags": None, "ok": True}
    page = _data_page(qtbot, tmp_path, [chat])
    qtbot.waitUntil(lambda: page.preview.rowCount() == 1, timeout=SHOWN_MS)
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
    qtbot.waitUntil(lambda: not page.objective_row.isHidden(), timeout=SHOWN_MS)
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


# -- the main window at 800×600 and the run's tabs ------------------------------------------------------------------
def _main_window(qtbot, tmp_path, names: dict[str, str], hardware: str = LAPTOP):
    from app.ops import settings
    from app.views.main_window import KEEP, MainWindow

    runs = settings.runs_dir()
    for fixture, name in names.items():
        shutil.copytree(FIXTURES / "run_dirs" / fixture, runs / name)
    w = MainWindow(hardware)
    w.ask_close_choice = lambda _runs: KEEP
    qtbot.addWidget(w)
    w.resize(800, 600)
    w.show()
    qtbot.waitUntil(lambda: w.run_list.topLevelItemCount() == len(names), timeout=SHOWN_MS)
    return w, runs


def _axes(w) -> dict:
    """The x range of each chart shown (a run with no GPU sample shows no GPU charts)."""
    return {k: tuple(p.viewRange()[0]) for k, p in w.run_view.dashboard.plots.items() if p.isVisible()}


@pytest.mark.slow  # plans and verdicts in the background: 10-30 s
def test_at_800x600_nothing_is_cut_and_each_run_has_its_own_axes(qtbot, tmp_path):
    from app.model import failed_start

    names = {"cpu_demo": "demo-20261125-153012", "laptop_run": "llama-3.2-1b-lora-20261124-091500"}
    w, runs = _main_window(qtbot, tmp_path, names)
    failed_start.record(str(runs / "mine-20261125-170000"), None, 2, "trainpilot-cli: data.path: x.jsonl not found\n", None)
    w.monitor.rescan()
    qtbot.waitUntil(lambda: w.run_list.topLevelItemCount() == 3, timeout=SHOWN_MS)
    rl = w.run_list
    for i in range(rl.topLevelItemCount()):  # every run's name whole (no "llama-3.2-…124-091500")
        name = rl.topLevelItem(i).text(0)
        assert rl.columnWidth(0) >= rl.fontMetrics().horizontalAdvance(name), name
    qtbot.waitUntil(lambda: "4090" in w.header.name.text(), timeout=SHOWN_MS)
    for label in (w.header.vram, w.header.driver):  # whole or hidden, never cut mid-word
        assert label.isHidden() or label.fontMetrics().horizontalAdvance(label.text()) <= label.width()
    w.open_run(str(runs / names["cpu_demo"]))
    dash = w.run_view.dashboard
    qtbot.waitUntil(lambda: "finished" in dash.headline.text() and dash.plots["tps"].listDataItems()[0].xData is not None,
                    timeout=SHOWN_MS)
    qtbot.wait(300)
    assert dash.headline.shown_text() == dash.headline.text()  # whole, on two lines
    tps = dash.data.tokens_per_s
    left, right = dash.plots["tps"].viewRange()[0]
    width = tps.x[-1] - tps.x[0]
    assert right - tps.x[-1] <= 0.05 * width and tps.x[0] - left <= 0.05 * width  # the axis is the data's span
    steps = dash.data.loss.x
    for name in ("loss", "lr", "grad"):  # the step charts show every step (not the last four: a linked chart set once)
        left, right = dash.plots[name].viewRange()[0]
        assert left <= steps[0] and right >= steps[-1], (name, (left, right), (steps[0], steps[-1]))
    demo_axes = _axes(w)
    w.open_run(str(runs / "mine-20261125-170000"))  # failed before its first step: no data at all
    qtbot.waitUntil(lambda: dash.data is not None and "mine-2026" in str(dash.data.run_dir), timeout=SHOWN_MS)
    qtbot.wait(500)
    axes = _axes(w)
    assert {"tps", "loss", "lr"} <= set(axes)
    assert all(axes[k] != demo_axes[k] for k in axes), (axes, demo_axes)  # nothing of the last run's windows
    assert axes["loss"] == (0.0, 10.0)
    w.hardware.stop()


def test_the_popup_of_a_killed_run_says_why_not_its_last_loss_lines():
    from types import SimpleNamespace

    from app.model.failed_start import ended_message

    tail = "step 3/40 loss 2.70\nstep 4/40 loss 2.60\n"
    killed = SimpleNamespace(error=None, reason="its supervisor (pid 4242) is gone; status.json still says running",
                             resumable=True, checkpoint_step=4)
    text = ended_message("demo-1", -9, killed, tail)
    assert text.startswith("demo-1 was killed (signal 9, SIGKILL): its supervisor (pid 4242) is gone")
    assert "loss" not in text and "Resume continues from checkpoint 4" in text
    bad = SimpleNamespace(error=None, reason=None, resumable=False)
    assert ended_message("r", 2, bad, "loading…\ntrainpilot-cli: data.path: x not found\n") == \
        "r ended with exit code 2 (bad input): trainpilot-cli: data.path: x not found"
    oom = SimpleNamespace(error="out of memory at every rung; micro-batch 1 would fit with LoRA", reason=None,
                          resumable=False)
    assert "(out of memory after every recovery step): out of memory at every rung" in ended_message("r", 3, oom, tail)


def _checkpoint(run, step: int) -> None:
    folder = run / "checkpoints" / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "trainpilot_checkpoint.json").write_text("{}")


def test_try_it_moves_to_final_when_the_run_finishes_and_keeps_a_pick(qtbot, tmp_path):
    from app.views.try_it import TryItTab
    from trainer.rundir.runstate import read_run_state

    run = tmp_path / "run"
    for step in (4, 8):
        _checkpoint(run, step)
    tab = TryItTab()
    qtbot.addWidget(tab)
    tab.bind(run)
    tab.follow(read_run_state(run))
    assert tab.checkpoint.currentData() == "8"  # the newest while there is no final
    (run / "final").mkdir()
    (run / "final" / "config.json").write_text("{}")
    (run / "status.json").write_text(json.dumps({"state": "finished", "step": 10, "max_steps": 10}))
    tab.follow(read_run_state(run))
    assert tab.checkpoint.currentData() == "final"  # the finished run's model, not its last checkpoint
    tab.checkpoint.setCurrentIndex(tab.checkpoint.findData("4"))
    # the user picked checkpoint 4: kept while it exists
    _checkpoint(run, 12)
    tab.follow(read_run_state(run))
    assert tab.checkpoint.currentData() == "4"


def test_an_empty_samples_tab_says_why(qtbot, tmp_path, fixture_run):
    from app.model.run_data import RunData
    from app.model.samples_note import NONE_ASKED, empty_samples_note
    from app.views.run_view import RunView
    from trainer.rundir.events import EventWriter

    run = fixture_run("cpu_demo")  # its config asks for no sample prompts
    view = RunView()
    qtbot.addWidget(view)
    data = RunData(run)
    data.poll()
    view.bind(data)
    view.refresh([])
    assert view.samples.topLevelItemCount() == 0 and view.samples_note.text() == NONE_ASKED
    view.resize(500, 400)  # walkthrough 8: the note, a one-line placeholder, was cut off; now every line shows
    view.show()
    view.tabs.setCurrentWidget(view.samples_tab)
    qtbot.waitUntil(lambda: view.samples_note.isVisible())
    note = view.samples_note
    assert note.height() >= note.heightForWidth(note.width()) > 2 * note.fontMetrics().lineSpacing()
    (run / "config.yaml").write_text("evaluation:\n  sample_prompts: [Hi]\n  sample_every_steps: 5\n")
    assert empty_samples_note(run, []) == "The answers to the sample prompts appear here every 5 steps; none yet."
    EventWriter(run / "events.jsonl").write("warning", code="samples_off", message="sample prompts are not generated "
                                            "under ZeRO-3")
    data.poll()
    view.refresh([])
    assert view.samples_note.text() == "No sample answers: sample prompts are not generated under ZeRO-3."


@pytest.mark.slow  # plans and verdicts in the background: 10-30 s
def test_review_forgets_a_failed_start_once_the_settings_change(qtbot, tmp_path):
    wiz = _wizard(qtbot)
    wiz.state.set("data.seq_len", 128)
    while wiz.currentPage() is not wiz.review:
        wiz.next()
    qtbot.waitUntil(lambda: wiz.review.result is not None, timeout=SHOWN_MS)
    wiz.review.started = wiz.state.config()  # what the failed start was of
    wiz.review.show_start_failure(2, "trainpilot-cli: data.path: mine.jsonl not found; check the path")
    qtbot.waitUntil(lambda: wiz.review.result is not None, timeout=SHOWN_MS)
    assert "The last start failed" in wiz.review.message.text()
    wiz.back()
    wiz.state.set("training.learning_rate", 0.001)  # the user changed something: that failure is not news
    wiz.next()
    qtbot.waitUntil(lambda: wiz.review.result is not None, timeout=SHOWN_MS)
    assert "The last start failed" not in wiz.review.message.text() and "Ready" in wiz.review.message.text()
