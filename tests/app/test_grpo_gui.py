"""GRPO in the GUI: a GRPO run's rewards charted per function and in total, its no-signal warning on the
Warnings tab, its samples with their rewards; the wizard's objective choice and Reward page.

The runs are tests/app/grpo_fixture.py's documented synthetic traces, written with the trainer's EventWriter."""
from __future__ import annotations

import math

import numpy as np
import pytest

from app.model import advice
from app.model.grpo_metrics import GrpoSeries, grpo_columns
from app.model.run_data import RunData
from conftest import SHOWN_MS
from grpo_fixture import FUNCTIONS, NO_SIGNAL_MESSAGE, WEIGHTS, step_metrics, write_grpo_run


@pytest.fixture
def grpo_run(tmp_path):
    return write_grpo_run(tmp_path / "runs" / "grpo", steps=40)


@pytest.fixture
def run_view(qtbot):
    from app.views.run_view import RunView

    view = RunView()
    qtbot.addWidget(view)
    view.build_dashboard()
    return view


def _read(path) -> RunData:
    data = RunData(path)
    assert data.poll()
    return data


# -- the model (Qt-free) -------------------------------------------------------------------------------
def test_columns_keep_every_function_aligned_and_gaps_as_nan():
    steps = [{"step": 1, "reward": 0.5, "reward_std": 0.1, "rewards": {"a": {"mean": 0.5, "std": 0.1}}},
             {"step": 2, "reward": 0.7, "rewards": {"a": {"mean": 0.6, "std": 0.2}, "b": {"mean": 1.0, "std": 0.0}}},
             {"step": 3, "reward": "bad", "rewards": {"b": {"mean": 0.0}}}]
    cols = grpo_columns(steps)
    assert cols["x"] == [1.0, 2.0, 3.0]
    assert cols["functions"]["a"]["mean"][:2] == [0.5, 0.6] and math.isnan(cols["functions"]["a"]["mean"][2])
    assert math.isnan(cols["functions"]["b"]["mean"][0]) and cols["functions"]["b"]["mean"][1:] == [1.0, 0.0]
    assert math.isnan(cols["reward"][2]) and math.isnan(cols["reward_std"][1]) and math.isnan(cols["kl"][0])
    g = GrpoSeries()
    g.started({"reward_functions": ["b", "a"], "reward_weights": [2.0, 1.0]})
    g.extend(cols)
    assert list(g.functions) == ["b", "a"] and g.label("b") == "b ×2" and g.label("a") == "a"
    assert np.allclose(g.functions["a"].high.y[:2], [0.6, 0.8]) and math.isnan(g.total.low.y[1])
    assert len(g) == 3 and not g.kl.has_values()


def test_run_data_reads_the_grpo_events(grpo_run):
    data = _read(grpo_run)
    assert data.objective == "grpo"
    assert list(data.grpo.functions) == FUNCTIONS and data.grpo.weights == dict(zip(FUNCTIONS, WEIGHTS))
    m = step_metrics(40, stalled=False)
    assert data.grpo.total.mean.y[-1] == m["reward"]
    assert math.isclose(data.grpo.functions["format"].low.y[-1],
                        m["rewards"]["format"]["mean"] - m["rewards"]["format"]["std"])
    assert data.grpo.no_signal.y[0] > 0.8 > data.grpo.no_signal.y[-1]
    assert data.grpo.kl.y[-1] == m["kl"] and data.grpo.completion_length.y[-1] == m["completion_length"]
    assert len(data.loss) == 40  # the usual step series still fill


# -- the charts -------------------------------------------------------------------------------------------
def test_rewards_tab_charts_each_function_with_its_band(run_view, grpo_run):
    data = _read(grpo_run)
    run_view.bind(data)
    run_view.refresh([])
    charts = run_view.rewards
    assert charts is not None and run_view.tabs.tabText(run_view.tabs.indexOf(charts)) == "Rewards"
    assert run_view.tabs.indexOf(charts) == run_view.tabs.indexOf(run_view.samples_tab) - 1
    assert charts.function_names() == FUNCTIONS
    assert charts.legend_labels() == ["numeric_answer", "format ×0.5", "reasoning_steps ×0.2"]
    fmt = charts.curves["fn:format"]
    assert list(fmt.xData) == list(range(1, 41))
    assert np.allclose(fmt.yData, data.grpo.functions["format"].mean.y)
    low, high = charts._band_edges["fn:format"]
    assert np.all(high.yData >= fmt.yData) and np.all(low.yData <= fmt.yData) and np.any(high.yData > low.yData)
    assert np.allclose(charts.curves["total"].yData, data.grpo.total.mean.y)
    assert charts.curves["no_signal"].yData[0] > 80  # percent
    assert np.allclose(charts.curves["kl"].yData, data.grpo.kl.y)
    assert charts.plots["kl"].titleLabel.text.startswith("KL to the start model")
    # the dashboard's reward chart shows the weighted total, titled for GRPO
    dash = run_view.dashboard
    assert dash.plots["reward"].isVisible() and "GRPO" in dash.plots["reward"].titleLabel.text
    assert np.allclose(dash.curves["reward"].yData, data.grpo.total.mean.y)
    assert f"reward {step_metrics(40, False)['reward']:.3g}" in dash.headline.text()


def test_the_validation_reward_is_charted_beside_the_total_not_a_loss(run_view, tmp_path):
    """GRPO's evaluation samples completions for the validation prompts and scores them with the run's rewards: the
    Rewards tab shows that reward at each evaluation (its validation loss, a policy-gradient term, is not written)."""
    data = _read(write_grpo_run(tmp_path / "val", steps=30, eval_every=10))
    assert list(data.grpo.validation.mean.x) == [10.0, 20.0, 30.0]
    run_view.bind(data)
    run_view.refresh([])
    charts = run_view.rewards
    m = step_metrics(30, stalled=False)
    assert list(charts.curves["validation"].xData) == [10.0, 20.0, 30.0]
    assert charts.curves["validation"].yData[-1] == pytest.approx(m["reward"] - 0.1)
    assert "validation" in charts.plots["total"].titleLabel.text
    assert not len(run_view.dashboard.eval_curve.xData or [])  # no eval loss on the dashboard's loss chart
    run_view.bind(_read(write_grpo_run(tmp_path / "noval", steps=6)))
    run_view.refresh([])
    assert "validation" not in run_view.rewards.plots["total"].titleLabel.text
    assert not len(run_view.rewards.curves["validation"].xData or [])


def test_no_kl_without_beta_says_why(run_view, tmp_path):
    run_view.bind(_read(write_grpo_run(tmp_path / "nokl", steps=6, beta=0.0)))
    run_view.refresh([])
    assert run_view.rewards.plots["kl"].titleLabel.text == "KL: not measured (grpo.beta is 0)"
    assert len(run_view.rewards.curves["entropy"].xData) == 6


def test_a_supervised_run_has_no_rewards_tab(run_view, grpo_run, fixture_run):
    run_view.bind(_read(grpo_run))
    run_view.refresh([])
    assert run_view.tabs.indexOf(run_view.rewards) >= 0
    run_view.bind(_read(fixture_run("cpu_demo")))
    run_view.refresh([])
    assert run_view.tabs.indexOf(run_view.rewards) == -1
    assert not run_view.dashboard.plots["reward"].isVisible()


def test_no_learning_signal_reaches_the_warnings_tab(run_view, tmp_path):
    data = _read(write_grpo_run(tmp_path / "stalled", steps=8, stalled=True))
    run_view.bind(data)
    items = advice.collect(data, None)
    run_view.refresh(items)
    assert NO_SIGNAL_MESSAGE in run_view.warnings.texts()
    assert [a.key for a in items if a.text == NO_SIGNAL_MESSAGE] == ["event:no_learning_signal"]
    assert run_view.tabs.tabText(run_view.tabs.indexOf(run_view.warnings)) == "Warnings (1)"
    assert np.all(run_view.rewards.curves["no_signal"].yData == 100.0)


def test_samples_show_rewards_newest_step_first(run_view, grpo_run):
    run_view.bind(_read(grpo_run))
    run_view.refresh([])
    view = run_view.samples
    rows = view.scores()
    assert [r[0] for r in rows[:2]] == [40, 40] and rows[-1][0] == 1
    step, reward, adv, per = rows[0]
    assert reward == "1.6" and per == "numeric_answer 1 · format 1 · reasoning_steps 0.5"
    assert adv.startswith("+")
    assert all(not view.isColumnHidden(c) for c in (2, 3, 4))
    answers = view.samples()
    assert answers[0][2].startswith("<think>") and answers[0][1].startswith(("Natalia", "Weng", "Betty"))
    view.setCurrentItem(view.topLevelItem(0).child(0))  # the detail pane shows the sample whole, with its scores
    detail = run_view.sample_detail.toPlainText()
    assert answers[0][1] in detail and answers[0][2] in detail
    assert "Reward 1.6" in detail and "advantage +" in detail
    assert detail.index("numeric_answer") < detail.index("format") < detail.index("reasoning_steps")  # the run's order


def test_supervised_samples_hide_the_reward_columns(qtbot):
    from app.views.learning_view import SamplesView

    view = SamplesView()
    qtbot.addWidget(view)

    class D:
        notices = [{"type": "sample", "step": 3, "prompt": "hi", "text": "hello", "tokens": 2}]

    assert view.refresh(D()) == 1
    assert all(view.isColumnHidden(c) for c in (2, 3, 4)) and view.samples() == [(3, "hi", "hello")]


# -- the wizard ------------------------------------------------------------------------------------------
GSM8K = [{"question": q, "answer": f"Worked out step by step.\n#### {a}"} for q, a in
         (("Natalia sold 48 clips in April and half as many in May. How many in all?", "72"),
          ("Weng earns $12 an hour. She worked 50 minutes. How much did she earn?", "10"),
          ("A wallet costs $100; Betty has half. Her parents give $15, grandparents $30. How much more?", "5"))]


def _gsm8k(tmp_path):
    import json

    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in GSM8K), encoding="utf-8")
    return path


@pytest.fixture
def wizard(qtbot):
    """A wizard without a hardware probe (nothing to plan: these tests stop before the plan)."""
    from app.views.wizard.wizard import SetupWizard

    wiz = SetupWizard(None)
    qtbot.addWidget(wiz)
    yield wiz
    wiz.data._cancel_report()
    wiz.rewards.cancel_preview()


def test_data_page_offers_grpo_for_a_gsm8k_file_and_then_the_reward_page(qtbot, tmp_path, wizard):
    page = wizard.data
    ids = wizard.pageIds()
    rewards_id, plan_id = ids[ids.index(wizard.pageIds()[3])], ids[4]
    assert wizard.page(rewards_id) is wizard.rewards and wizard.page(plan_id) is wizard.plan
    assert page.nextId() == plan_id  # a supervised objective skips the Reward page
    page.path.setText(str(_gsm8k(tmp_path)))
    page.path.editingFinished.emit()
    qtbot.waitUntil(lambda: "3 records" in page.stats.text(), timeout=SHOWN_MS)
    assert "gsm8k" in page.stats.text() and "GRPO" in page.stats.text()
    assert not page.objective_row.isHidden()
    choices = [page.objective.itemData(i) for i in range(page.objective.count())]
    assert choices == [None, "sft", "grpo"]  # nothing chosen for the user: GSM8K is a question and its answer too
    assert not page.isComplete()  # Next waits for the choice
    assert page.preview.rowCount() == 3
    page.objective.setCurrentIndex(2)
    page.objective.activated.emit(2)
    assert wizard.state.values["training.objective"] == "grpo" and page.isComplete()
    assert page.nextId() == rewards_id
    page._cancel_report()


def test_a_supervised_file_is_not_offered_grpo(qtbot, tmp_path, wizard):
    import json

    path = tmp_path / "text.jsonl"
    path.write_text("".join(json.dumps({"text": f"record {i}"}) + "\n" for i in range(4)))
    page = wizard.data
    page.path.setText(str(path))
    page.path.editingFinished.emit()
    qtbot.waitUntil(lambda: "4 records" in page.stats.text(), timeout=SHOWN_MS)
    assert page.record_format == "text" and page.objective_row.isHidden()
    page._cancel_report()


def test_reward_page_refuses_to_go_on_without_a_reward(qtbot, wizard):
    page = wizard.rewards
    page.show()
    page.initializePage()
    assert not page.isComplete()
    assert "Tick at least one reward" in page.problem.text()
    page.ticks["format"].setChecked(True)
    assert page.isComplete() and page.problem.text() == ""
    page.ticks["format"].setChecked(False)
    assert not page.isComplete() and wizard.state.values["rewards.format"] == 0.0
    page.start_preview()  # Preview says the same where it is pressed, and starts nothing
    assert not page.previewing and "Tick at least one reward" in page.preview_status.text()


def test_a_reward_file_that_does_not_exist_is_refused_beside_its_field(qtbot, tmp_path, wizard, monkeypatch):
    monkeypatch.chdir(tmp_path)
    page = wizard.rewards
    page.show()
    page.initializePage()
    page.python.setText("missing_rewards.py")
    page.python.editingFinished.emit()
    error = page.errors["rewards.python"]
    assert not error.isHidden() and "file not found: missing_rewards.py" in error.text()
    assert not page.isComplete()  # a named file must exist, even with nothing else ticked
    (tmp_path / "missing_rewards.py").write_text("def r(prompts, completions, **kw):\n    return [0.0] * len(completions)\n")
    page.python.editingFinished.emit()
    assert error.isHidden() and page.isComplete()


def test_the_reward_settings_are_saved_as_typed(qtbot, tmp_path, wizard):
    import yaml

    reward_file = tmp_path / "my rewards.py"
    reward_file.write_text("def short(prompts, completions, **kw):\n    return [1.0] * len(completions)\n")
    page, state = wizard.rewards, wizard.state
    page.show()
    page.initializePage()
    page.ticks["numeric_answer"].setChecked(True)
    page.weights["numeric_answer"].setValue(0.75)
    page.ticks["format"].setChecked(True)
    page.weights["format"].setValue(0.25)
    page.ticks["length_penalty"].setChecked(True)
    page.params["rewards.length_target"].setValue(96)
    typed = {"rewards.format_pattern": r"^<think>.+</think>\s*<answer>\d+</answer>$",
             "rewards.numeric_tolerance": "0.01", "rewards.answer_field": "answer",
             "rewards.answer_pattern": r"<answer>(.*?)</answer>", "grpo.system_prompt": "Answer in <answer> tags."}
    for key, text in typed.items():
        page.params[key].setText(text)
        page.params[key].editingFinished.emit()
    page.python.setText(str(reward_file))
    page.python.editingFinished.emit()
    assert page.isComplete()
    page.params["rewards.numeric_tolerance"].setText("a lot")  # refused beside the field, the last good value kept
    page.params["rewards.numeric_tolerance"].editingFinished.emit()
    assert "'a lot' is not a tolerance" in page.errors["rewards.numeric_tolerance"].text()
    state.update({"training.objective": "grpo", "training.effective_batch_size": 16})
    saved = yaml.safe_load(state.write_config(str(tmp_path / "runs" / "grpo-run"), state.final_config()).read_text())
    r = saved["rewards"]
    assert (r["numeric_answer"], r["format"], r["length_penalty"], r["exact_answer"], r["json_valid"]) == (0.75, 0.25, 1.0, 0, 0)
    assert r["format_pattern"] == typed["rewards.format_pattern"] and r["answer_pattern"] == typed["rewards.answer_pattern"]
    assert r["numeric_tolerance"] == 0.01 and r["length_target"] == 96 and r["python"] == str(reward_file)
    assert saved["grpo"]["system_prompt"] == "Answer in <answer> tags." and saved["training"]["objective"] == "grpo"


@pytest.mark.slow  # the preview child loads the tiny demo model and samples: ~10-40 s on the 2-core machine
def test_preview_fills_the_table_from_the_child_without_blocking(qtbot, tmp_path, wizard):
    state, page = wizard.state, wizard.rewards
    state.update({"model.source": "demo-tiny-llama", "data.path": str(_gsm8k(tmp_path)), "data.seq_len": 256,
                  "device": "cpu", "training.objective": "grpo", "grpo.max_completion_length": 16})
    page.show()
    page.initializePage()
    page.ticks["numeric_answer"].setChecked(True)
    page.n_prompts.setValue(2)
    page.n_completions.setValue(3)
    page.start_preview()
    assert page.previewing and not page.preview_button.isEnabled()  # returned at once: the child runs on its own
    qtbot.waitUntil(lambda: not page.previewing, timeout=240000)
    assert page.preview_doc is not None, page.preview_status.text()
    headers = [page.table.horizontalHeaderItem(j).text() for j in range(page.table.columnCount())]
    assert headers == ["Prompt", "Reference", "Completion", "numeric_answer", "Total"]
    assert page.table.rowCount() == 6 and page.table.item(0, 1).text() == "72" and page.table.item(3, 1).text() == "10"
    assert "2 prompts × 3 completions" in page.preview_status.text()


def test_a_preview_cancelled_by_leaving_the_page_shows_nothing_late(qtbot, tmp_path, wizard):
    state, page = wizard.state, wizard.rewards
    state.update({"data.path": str(_gsm8k(tmp_path)), "training.objective": "grpo", "device": "cpu"})
    page.show()
    page.initializePage()
    page.ticks["exact_answer"].setChecked(True)
    page.start_preview()
    job = page._job
    assert job is not None and job.running()
    page.cleanupPage()  # Back
    assert not page.previewing and not job.running() and page.preview_status.text() == "Preview cancelled."
    assert page.table.rowCount() == 0


def test_a_broken_reward_file_fails_the_preview_with_the_childs_message(qtbot, tmp_path, wizard):
    bad = tmp_path / "broken_rewards.py"
    bad.write_text("def r(prompts, completions, **kw)\n    return [0.0]\n")  # no colon: a syntax error on line 1
    state, page = wizard.state, wizard.rewards
    state.update({"data.path": str(_gsm8k(tmp_path)), "training.objective": "grpo", "device": "cpu"})
    page.show()
    page.initializePage()
    page.python.setText(str(bad))
    page.python.editingFinished.emit()
    assert page.isComplete()  # the file exists; what is in it is the child's to say
    page.start_preview()
    qtbot.waitUntil(lambda: not page.previewing, timeout=120000)
    status = page.preview_status.text()
    assert "Preview failed: rewards.python:" in status and "line 1: syntax error" in status, status
    assert page.table.rowCount() == 0 and page.preview_button.isEnabled()


@pytest.mark.slow  # plans, then Review's preflight runs the GRPO check child (tokenizer, rewards dry run)
def test_a_grpo_run_through_review_saves_the_rewards_as_typed(qtbot, tmp_path):
    import yaml
    from conftest import FIXTURES
    from PySide6 import QtWidgets

    from app.ops.hardware_feed import HardwareMonitor
    from app.views.wizard.page_review import where
    from app.views.wizard.wizard import SetupWizard
    from trainer import config as tc

    assert where("rewards.python") == "Rewards page" and where("rewards") == "Rewards page"
    hw = HardwareMonitor(str(FIXTURES / "hardware" / "no_gpu.jsonl"))
    hw.start()
    wiz = SetupWizard(hw)
    qtbot.addWidget(wiz)
    wiz.show()
    try:
        qtbot.waitUntil(lambda: hw.latest is not None, timeout=SHOWN_MS)
        wiz.state.set("data.seq_len", 512)
        wiz.next()
        wiz.next()
        wiz.data.path.setText(str(_gsm8k(tmp_path)))
        wiz.data.path.editingFinished.emit()
        qtbot.waitUntil(lambda: not wiz.data.objective_row.isHidden(), timeout=SHOWN_MS)
        wiz.data.objective.setCurrentIndex(wiz.data.objective.findData("grpo"))
        wiz.data.objective.activated.emit(wiz.data.objective.currentIndex())
        wiz.next()
        assert wiz.currentPage() is wiz.rewards and not wiz.button(QtWidgets.QWizard.NextButton).isEnabled()
        wiz.rewards.ticks["numeric_answer"].setChecked(True)
        wiz.rewards.weights["numeric_answer"].setValue(1.5)
        wiz.rewards.params["rewards.format_pattern"].setText(r"<answer>\d+</answer>")
        wiz.rewards.params["rewards.format_pattern"].editingFinished.emit()
        wiz.rewards.ticks["format"].setChecked(True)
        wiz.next()
        assert wiz.currentPage() is wiz.plan
        wiz.next()
        qtbot.waitUntil(lambda: wiz.review.result is not None, timeout=120000)
        saved = yaml.safe_load(wiz.review.yaml.toPlainText())
        assert saved["training"]["objective"] == "grpo"
        assert saved["rewards"]["numeric_answer"] == 1.5 and saved["rewards"]["format"] == 1.0
        assert saved["rewards"]["format_pattern"] == r"<answer>\d+</answer>"
        assert wiz.review.start_button.isEnabled(), wiz.review.message.text()
        with qtbot.waitSignal(wiz.start_requested) as sig:
            wiz.review.start_button.click()
        cfg = tc.load(sig.args[0])
        assert (cfg.rewards.numeric_answer, cfg.rewards.format, cfg.rewards.format_pattern) == (1.5, 1.0, r"<answer>\d+</answer>")
    finally:
        wiz.data._cancel_report()
        wiz.rewards.cancel_preview()
        hw.stop()
