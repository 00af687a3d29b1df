"""The dashboard charts a preference run's reward accuracy and margin from its step events.

tests/fixtures/run_dirs/dpo_run was recorded from a real 12-step DPO LoRA run of the tiny model on the
synthetic pairs of tests/helpers_pref.py (`python -m trainer run`, CPU; checkpoints and weights left out)."""
from __future__ import annotations

from app.views.dashboard import Dashboard
from app.model.run_data import RunData


def test_reward_accuracy_and_margin_are_charted(qtbot, fixture_run):
    data = RunData(fixture_run("dpo_run"))
    assert data.poll()
    dash = Dashboard()
    qtbot.addWidget(dash)
    dash.set_data(data)
    acc, margin = dash.curves["reward"], dash.curves["margin"]
    assert list(acc.xData) == list(range(1, 13)) and list(margin.xData) == list(range(1, 13))
    assert acc.yData[0] == 0.0 and acc.yData[-1] == 1.0
    assert margin.yData[-1] > margin.yData[0]
    assert dash.plots["reward"].isVisible()


def test_supervised_run_has_no_reward_chart(qtbot, fixture_run):
    data = RunData(fixture_run("cpu_demo"))
    data.poll()
    dash = Dashboard()
    qtbot.addWidget(dash)
    dash.set_data(data)
    assert data.reward_margin.n == 0 and len(dash.curves["loss"].xData) == 24
    assert not dash.plots["reward"].isVisible()  # no empty chart for a run that has no rewards
