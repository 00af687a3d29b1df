"""The dashboard fed by a recorded run directory, and tolerance of a half-written last line."""
from __future__ import annotations

import json

from app.views.dashboard import Dashboard
from app.model.run_data import RunData


def dashboard_on(qtbot, run, size: tuple[int, int] | None = None) -> tuple[Dashboard, RunData]:
    """A Dashboard fed the run folder ``run`` read once; shown at ``size`` first when given (charts lay out)."""
    dash = Dashboard()
    qtbot.addWidget(dash)
    if size:
        dash.resize(*size)
        dash.show()
    data = RunData(run)
    data.poll()
    dash.set_data(data)
    return dash, data


def test_dashboard_shows_recorded_run(qtbot, fixture_run):
    run = fixture_run("laptop_run")
    data = RunData(run)
    assert data.poll()
    dash = Dashboard()
    qtbot.addWidget(dash)
    dash.set_data(data)
    dash.show()
    x, y = dash.curves["loss"].xData, dash.curves["loss"].yData
    assert len(x) == 120 and x[-1] == 120 and abs(y[0] - (2.5 * 2.7182818 ** (-1 / 60) + 1.2)) < 1e-3
    assert len(dash.curves["temp"].xData) == 122
    assert max(dash.curves["vram"].yData) > 14  # GiB
    assert dash.peak_line.isVisible() and abs(dash.peak_line.value() - 14.2) < 0.01
    assert len(dash.throttle_spans) == 1  # the thermal throttle episode is shaded
    start, end = dash.throttle_spans[0]
    assert end - start == 30
    text = dash.headline.text()
    assert "step 120 of 120" in text and "effective batch 16" in text and "finished" in text


def test_half_written_last_line_breaks_nothing(qtbot, fixture_run):
    run = fixture_run("laptop_run")
    events = run / "events.jsonl"
    with open(events, "a") as fh:
        fh.write('{"type": "step", "time": 1763700200.0, "step": 121, "loss": 1.1')  # writer mid-line
    with open(run / "telemetry.jsonl", "a") as fh:
        fh.write('{"time": 1763700300.0, "gpus": [{"memory_used')
    data = RunData(run)
    dash = Dashboard()
    qtbot.addWidget(dash)
    dash.set_data(data)
    data.poll()
    dash.refresh()
    assert data.last_step["step"] == 120
    with open(events, "a") as fh:  # the writer finishes the line: the next poll picks it up
        fh.write(', "max_steps": 121, "learning_rate": 1e-5}\n' + json.dumps({"type": "brand_new_type"}) + "\n")
    assert data.poll()
    dash.refresh()
    assert data.last_step["step"] == 121 and dash.curves["loss"].xData[-1] == 121


def test_dashboard_shows_real_cpu_demo_recording(qtbot, fixture_run):
    """tests/fixtures/run_dirs/cpu_demo was recorded from `python -m trainer demo --set training.max_steps=24
    --set checkpoints.every_steps=8` on this CPU-only machine (checkpoints and weights left out)."""
    dash, data = dashboard_on(qtbot, fixture_run("cpu_demo"))
    assert list(dash.curves["loss"].xData) == list(range(1, 25))
    assert len(dash.curves["tps"].xData) == 24 and min(dash.curves["tps"].yData) > 0
    assert dash.curves["vram"].xData is None or len(dash.curves["vram"].xData) == 0  # no GPU: nothing to draw, nothing breaks
    assert len(data.host_ram_available) > 10  # the supervisor's 1 Hz telemetry still arrived
    assert "step 24 of 24" in dash.headline.text() and "finished" in dash.headline.text()
    for name in ("vram", "temp", "power", "util"):  # GPU charts of a CPU run say why they are empty
        assert dash.plots[name].titleLabel.text.endswith(": no data"), name
    assert not dash.hot_line.isVisible() and "no GPU" not in dash.plots["tps"].titleLabel.text
    assert dash.plots["temp"].viewRange()[1] == [0, 100], "not a 79.6-80.4 axis around the hidden 80 °C line"


def _y_range(dash: Dashboard, name: str) -> list[float]:
    return [round(v, 3) for v in dash.plots[name].getViewBox().viewRange()[1]]


def test_a_cpu_run_keeps_no_gpu_samples_after_resume_and_ranges_reset_per_run(qtbot, fixture_run):
    gpu_run, cpu_run = fixture_run("laptop_run"), fixture_run("cpu_demo")
    last = json.loads((cpu_run / "telemetry.jsonl").read_text().splitlines()[-1])
    with open(cpu_run / "telemetry.jsonl", "a") as fh:  # stopped, then resumed a minute later
        for dt in (60.0, 61.0, 62.0):
            fh.write(json.dumps(dict(last, time=last["time"] + dt)) + "\n")
    with open(cpu_run / "events.jsonl", "a") as fh:
        fh.write(json.dumps({"type": "run_started", "time": last["time"] + 60.0}) + "\n")
    dash = Dashboard()
    qtbot.addWidget(dash)
    dash.resize(1200, 800)
    dash.show()
    gpu = RunData(gpu_run)
    gpu.poll()
    dash.set_data(gpu)
    qtbot.wait(50)
    assert _y_range(dash, "power")[1] > 150  # the laptop's watts
    cpu = RunData(cpu_run)
    cpu.poll()
    dash.set_data(cpu)
    qtbot.wait(50)
    assert len(cpu.temperature) == 0 and len(cpu.host_ram_available) > 0  # the resume gap is no GPU sample
    for name in ("vram", "temp", "power", "util"):
        assert not cpu.gpu_series[{"vram": "vram_used"}.get(name, name)].has_values()
        assert dash.plots[name].titleLabel.text.endswith(": no data"), name
    assert _y_range(dash, "power") == [0, 100] and _y_range(dash, "vram") == [0, 1]
    assert _y_range(dash, "temp") == [0, 100] and not dash.hot_line.isVisible()
    dash.set_data(gpu)
    qtbot.wait(50)
    assert _y_range(dash, "power")[1] > 150 and dash.plots["power"].titleLabel.text == "Power"


def test_a_cpu_runs_dashboard_is_its_own_charts_and_one_step_draws_a_point(qtbot, fixture_run):
    """Walkthrough 8: a CPU run's dashboard gave half its space to four empty GPU charts; after one step the loss and
    learning-rate charts drew nothing on axes of -3…5."""
    gpu_run, cpu_run = fixture_run("laptop_run"), fixture_run("cpu_demo")
    lines = (cpu_run / "events.jsonl").read_text().splitlines()
    first_step = next(i for i, line in enumerate(lines) if '"type": "step"' in line)
    (cpu_run / "events.jsonl").write_text("\n".join(lines[:first_step + 1]) + "\n")  # one step so far
    dash = Dashboard()
    qtbot.addWidget(dash)
    dash.resize(1000, 700)
    dash.show()
    cpu = RunData(cpu_run)
    cpu.poll()
    dash.set_data(cpu)
    qtbot.wait(50)
    assert not any(dash.plots[name].isVisible() for name in ("vram", "temp", "power", "util"))
    assert dash.plots["tps"].height() > dash.graphs.height() * 0.4, "the run's own charts take the room"
    for name in ("loss", "lr"):
        x0, x1 = dash.plots[name].getViewBox().viewRange()[0]
        assert x0 >= 0 and x1 >= 1, (name, x0, x1)
        assert dash.curves[name].opts["symbol"] == "o", f"one step's {name} is a visible dot"
    assert cpu.poll() is False
    gpu = RunData(gpu_run)
    gpu.poll()
    dash.set_data(gpu)
    qtbot.wait(50)
    assert all(dash.plots[name].isVisible() for name in ("vram", "temp", "power", "util"))
    assert dash.curves["loss"].opts["symbol"] is None  # 120 steps: a line


def test_the_headline_says_when_the_optimizer_step_ran_in_backward(qtbot, fixture_run):
    """run_started's ``optimizer_step`` (what the worker built): the fused step is named in the headline, with where
    its states live; the separate step (the default) and runs recorded before the field add nothing."""
    run = fixture_run("cpu_demo")
    dash, data = dashboard_on(qtbot, run)
    assert "optimizer step" not in dash.headline.text()
    events = run / "events.jsonl"
    said = {"step": "fused", "states": "paged_adamw_8bit", "paged": True, "optimizer": "bitsandbytes.AdamW"}
    with open(events, "a") as fh:  # a resumed attempt whose worker built the fused step
        fh.write(json.dumps({"type": "run_started", "time": 1.8e9, "optimizer_step": said}) + "\n")
    assert data.poll()
    dash.refresh()
    assert dash.headline.text().endswith(" · optimizer step fused into backward, states paged_adamw_8bit")
    with open(events, "a") as fh:  # the next attempt stepped after backward
        fh.write(json.dumps({"type": "run_started", "time": 1.8e9 + 9, "optimizer_step": {**said, "step": "separate"}})
                 + "\n")
    assert data.poll()
    dash.refresh()
    assert "optimizer step" not in dash.headline.text()
