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
    assert run_view.tabs.indexOf(charts) == run_view.tabs.indexOf(run_view.samples) - 1
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


def test_supervised_samples_hide_the_reward_columns(qtbot):
    from app.views.learning_view import SamplesView

    view = SamplesView()
    qtbot.addWidget(view)

    class D:
        notices = [{"type": "sample", "step": 3, "prompt": "hi", "text": "hello", "tokens": 2}]

    assert view.refresh(D()) == 1
    assert all(view.isColumnHidden(c) for c in (2, 3, 4)) and view.samples() == [(3, "hi", "hello")]
