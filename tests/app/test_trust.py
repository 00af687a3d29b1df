"""Issue 12's findings, each as a test with real widgets (offscreen) and real child processes:
typed values are stored as typed, Review tells the truth, one run per folder, a failed start keeps
everything, and the charts show the selected run's own data."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import FIXTURES, SHOWN_MS, started_wizard
from PySide6 import QtCore

from app.views.main_window import KEEP, MainWindow
from app.ops.run_controller import RunController
from app.views.wizard.wizard import SetupWizard
from trainer.supervisor import runlock

LAPTOP = str(FIXTURES / "hardware" / "rtx4090_laptop_16gb.jsonl")
NO_GPU = str(FIXTURES / "hardware" / "no_gpu.jsonl")


def _wizard(qtbot, hardware: str) -> SetupWizard:
    return started_wizard(qtbot, hardware)


def _to_review(qtbot, wiz) -> None:
    while wiz.currentPage() is not wiz.review:
        wiz.next()
    qtbot.waitUntil(lambda: wiz.review.result is not None, timeout=20000)


@pytest.mark.slow  # measured >= 3.5 s on the 2-core machine
def test_typing_0003_keystroke_by_keystroke_stores_0003(qtbot):
    wiz = _wizard(qtbot, NO_GPU)
    wiz.next(), wiz.next(), wiz.next()
    assert wiz.currentPage() is wiz.plan
    field = wiz.plan.learning_rate  # on the method page itself, not only under Advanced
    field.edit.setFocus()
    field.edit.selectAll()
    for i, key in enumerate("0.003"):
        qtbot.keyClicks(field.edit, key)
        qtbot.wait(200)  # re-plans and syncs happen meanwhile: none may touch the text being typed
        assert field.text() == "0.003"[: i + 1]
    qtbot.keyClick(field.edit, QtCore.Qt.Key_Return)
    assert wiz.currentPage() is wiz.plan  # Enter takes the value; it does not press Next
    assert wiz.state.values["training.learning_rate"] == 0.003
    assert wiz.state.config().training.learning_rate == 0.003
    qtbot.waitUntil(lambda: wiz.plan.advanced.editors["training.learning_rate"].text() == "0.003", timeout=SHOWN_MS)
    # A bad value: the error shows beside the field, and the text stays as typed.
    adv = wiz.plan.advanced.editors["training.learning_rate"]
    wiz.plan.advanced_toggle.setChecked(True)
    adv.edit.setFocus()
    adv.edit.selectAll()
    qtbot.keyClicks(adv.edit, "-1")
    qtbot.keyClick(adv.edit, QtCore.Qt.Key_Return)
    qtbot.waitUntil(lambda: adv.error.isVisible(), timeout=SHOWN_MS)
    assert adv.text() == "-1" and "greater than 0" in adv.error.text()
    assert field.error.isVisible()  # the method page's field names the same problem
    assert wiz.currentPage() is wiz.plan


@pytest.mark.slow  # measured >= 3.5 s on the 2-core machine
def test_review_blocks_does_not_fit_and_architecture_without_tokenizer(qtbot, cuda_torch):
    wiz = _wizard(qtbot, LAPTOP)
    wiz.next()
    wiz.model.use_architecture("llama-3.2-3b")
    qtbot.waitUntil(lambda: "random weights — for testing" in wiz.model.facts.text(), timeout=15000)
    # a 3B full fine-tune at 2048 tokens does not fit a 16 GB laptop (a 1B one does now: chunked loss and
    # activation offload)
    wiz.state.set("method.type", "full")
    _to_review(qtbot, wiz)
    text = wiz.review.message.text()
    assert wiz.review.result.plan.verdict == "does_not_fit"
    assert "does not fit" in text and "Method page" in text and "GiB" in text, text
    assert not wiz.review.start_button.isEnabled()
    # A 135M model with LoRA fits (whatever the replay's other programs hold); but an architecture
    # (random weights) without a tokenizer must not reach for the hub.
    wiz.back()
    wiz.state.update({"method.type": "lora", "model.source": "smollm-135m", "model.architecture": "smollm-135m",
                      "model.tokenizer": None})
    _to_review(qtbot, wiz)
    text = wiz.review.message.text()
    assert wiz.review.result.plan.verdict in ("fits", "tight")
    assert "<b>Tokenizer</b> (Model page)" in text and "no tokenizer" in text, text
    assert not wiz.review.start_button.isEnabled()
    # Typing the architecture's name as if it were a model is caught too.
    wiz.back()
    wiz.state.update({"model.architecture": None, "model.tokenizer": None})
    _to_review(qtbot, wiz)
    assert "shipped architecture" in wiz.review.message.text() and not wiz.review.start_button.isEnabled()
    # With the bundled tokenizer it is allowed (and says what it is).
    wiz.back()
    wiz.state.update({"model.architecture": "smollm-135m", "model.tokenizer": "demo"})
    _to_review(qtbot, wiz)
    assert wiz.review.start_button.isEnabled(), wiz.review.message.text()


def test_double_start_is_refused(qtbot, tmp_path):
    ctl = RunController()
    run_dir = str(tmp_path / "runs" / "demo-once")
    refusals = []
    ctl.refused.connect(lambda d, why: refusals.append(why))
    ctl.start_demo(run_dir, ("training.max_steps=200",))
    try:
        ctl.start_demo(run_dir, ("training.max_steps=200",))  # the double click
        assert len(refusals) == 1 and "already" in refusals[0]
        assert list(ctl.children) == [run_dir]
    finally:
        ctl.kill_tree(run_dir, wait=True)
        ctl.children[run_dir][0].wait(timeout=30)


def test_supervisor_holds_one_run_per_folder(tmp_path):
    """Two `trainpilot-cli resume` on one folder: the second is refused (exit 2) while the first holds it."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "run_dirs" / "cpu_demo", run)
    status = json.loads((run / "status.json").read_text())
    (run / "status.json").write_text(json.dumps(dict(status, state="stopped", pid=None)))
    runlock.hold(run)  # this test process is "the first supervisor"
    out = subprocess.run([sys.executable, "-m", "trainer", "resume", str(run)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2, out.stderr
    # runstate sees the held lock first ("still running"); the lock itself says "already being run"
    assert ("already being run" in out.stderr or "is still running" in out.stderr) and "Traceback" not in out.stderr


def _window(qtbot) -> MainWindow:
    w = MainWindow(NO_GPU)
    w.ask_close_choice = lambda runs: KEEP
    qtbot.addWidget(w)
    w.show()
    return w


@pytest.mark.slow  # measured >= 3.5 s on the 2-core machine
def test_failed_start_returns_to_the_wizard_with_values_kept(qtbot, tmp_path):
    w = _window(qtbot)
    w.open_wizard()
    wiz = w.wizard
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"text": f"record {i}"}) + "\n" for i in range(50)))
    wiz.next(), wiz.next(), wiz.next()  # past the data page, which sets data.path from its own field
    wiz.state.update({"data.path": str(data), "data.seq_len": 128, "training.learning_rate": 0.003,
                      "training.max_steps": 7})
    _to_review(qtbot, wiz)
    assert wiz.review.start_button.isEnabled(), wiz.review.message.text()
    run_dir = wiz.review.run_dir.text()
    data.unlink()  # the file goes away between Review and the start: the CLI refuses (exit 2)
    wiz.review.start_button.click()
    assert not wiz.isVisible()
    qtbot.waitUntil(lambda: wiz.isVisible(), timeout=60_000)
    assert w.wizard is wiz and wiz.currentPage() is wiz.review
    assert wiz.state.values["training.learning_rate"] == 0.003 and wiz.state.values["training.max_steps"] == 7
    assert wiz.state.values["data.path"] == str(data)
    qtbot.waitUntil(lambda: wiz.review.result is not None, timeout=20000)
    text = wiz.review.message.text()
    assert "last start failed" in text and "exit code 2" in text and "not found" in text, text
    assert "<b>Path</b> (Data page)" in text  # and the field that caused it
    # The folder now holds the failed start (listed below): the next start gets a fresh one.
    assert wiz.review.run_dir.text() != run_dir and "already exists" not in text, text
    # The failed run is listed, with its log.
    qtbot.waitUntil(lambda: any(w.run_list.topLevelItem(i).text(0) == Path(run_dir).name
                                for i in range(w.run_list.topLevelItemCount())), timeout=SHOWN_MS)
    assert w.monitor.current is not None and str(w.monitor.current.run_dir) == str(Path(run_dir).resolve())
    qtbot.waitUntil(lambda: "not found" in w.run_view.log.toPlainText(), timeout=SHOWN_MS)
    qtbot.waitUntil(lambda: w.run_view.failure.isVisible(), timeout=SHOWN_MS)
    w.hardware.stop()


def _append_resume(run: Path, gap_s: float, steps: int) -> None:
    """A stop, then a resumed attempt ``gap_s`` seconds later with ``steps`` more steps."""
    lines = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines() if x.strip()]
    last = [e for e in lines if e.get("type") == "step"][-1]
    t = last["time"] + gap_s
    with open(run / "events.jsonl", "a") as fh:
        fh.write(json.dumps({"type": "run_started", "time": t, "attempt": 2, "pid": 1}) + "\n")
        for i in range(1, steps + 1):
            fh.write(json.dumps(dict(last, time=t + i, step=last["step"] + i, tokens_per_second=999.0)) + "\n")


@pytest.mark.slow  # measured >= 3.5 s on the 2-core machine
def test_throughput_chart_follows_the_selected_run_and_draws_resume_gaps(qtbot, fixture_run):
    laptop, demo = fixture_run("laptop_run"), fixture_run("cpu_demo")
    _append_resume(demo, gap_s=600, steps=5)
    w = _window(qtbot)
    tps = w.run_view.dashboard.curves["tps"]
    for run, other in ((laptop, demo), (demo, laptop), (laptop, demo)):
        w.open_run(str(run))
        qtbot.waitUntil(lambda: w.monitor.current.loaded and w.run_view.dashboard.data is w.monitor.current, timeout=10000)
        qtbot.wait(400)
        own = w.monitor.current.tokens_per_s
        assert np.array_equal(tps.xData, own.x) and np.array_equal(tps.yData, own.y, equal_nan=True)
        vb = w.run_view.dashboard.plots["tps"].getViewBox()
        lo, hi = vb.viewRange()[0]
        span = own.x[-1] - own.x[0]
        # Its own time range (linked time plots align by pixel, so allow a few % for axis widths).
        assert lo <= own.x[0] + 0.05 * span and hi >= own.x[-1] - 0.05 * span and hi - lo < span * 1.5 + 120
        assert 0 <= vb.viewRange()[1][0] <= 1 and vb.viewRange()[1][1] >= np.nanmax(own.y)  # from zero
    # The demo run was stopped and resumed 10 minutes later: a gap, not a line across it.
    w.open_run(str(demo))
    qtbot.waitUntil(lambda: w.monitor.current.loaded, timeout=10000)
    qtbot.wait(400)
    x, y = tps.xData, tps.yData
    gap = np.flatnonzero(np.isnan(y))
    assert len(gap) == 1 and np.all(np.isfinite(x)) and x[gap[0] + 1] - x[gap[0] - 1] >= 600
    assert y[-1] == 999.0  # the resumed attempt's own steps are drawn
    # A resume while the run is shown arrives live.
    _append_resume(demo, gap_s=300, steps=3)
    qtbot.waitUntil(lambda: len(np.flatnonzero(np.isnan(tps.yData))) == 2, timeout=SHOWN_MS)
    w.hardware.stop()


def test_finished_run_says_where_the_model_is(qtbot, fixture_run):
    run = fixture_run("cpu_demo")
    (run / "final").mkdir()
    (run / "final" / "config.json").write_text("{}")  # a model (runstate: an empty final/ is none)
    w = _window(qtbot)
    w.open_run(str(run))
    bar = w.run_view.model_bar
    qtbot.waitUntil(lambda: bar.isVisible(), timeout=SHOWN_MS)
    assert "Your model:" in bar.label.text() and str(run / "final") in bar.label.text()
    assert bar.open_button.isVisible()
    # Try it / Export model appear only when the after-training features connect to them.
    assert not bar.buttons["try"].isVisible() and not bar.buttons["export"].isVisible()
    got = []
    bar.connect_action("try", got.append)
    assert bar.buttons["try"].isVisible()
    bar.buttons["try"].click()
    assert got == [str(run / "final")]
    assert "ETA" not in w.run_view.dashboard.headline.text()
    w.hardware.stop()


def test_log_view_shows_line_starts(qtbot, fixture_run):
    """The log tail is scrolled to its end without cutting the start of the lines (a long last line
    used to scroll the view sideways, hiding the first characters of every line)."""
    run = fixture_run("cpu_demo")
    with open(run / "train.log", "a") as fh:
        fh.write("step 24 " + "x" * 2000 + "\n")
    w = _window(qtbot)
    w.open_run(str(run))
    w.run_view.tabs.setCurrentIndex(2)
    qtbot.waitUntil(lambda: "x" * 100 in w.run_view.log.toPlainText(), timeout=SHOWN_MS)
    qtbot.wait(100)
    assert w.run_view.log.horizontalScrollBar().value() == 0
    assert w.run_view.log.verticalScrollBar().value() == w.run_view.log.verticalScrollBar().maximum()
    w.hardware.stop()


@pytest.mark.slow  # the doctor imports torch in a child process: ~45 s on a loaded 2-core machine
def test_environment_page_says_the_header_is_a_replay_and_checks_disk_where_runs_go(qtbot, trainpilot_home):
    wiz = _wizard(qtbot, LAPTOP)
    assert wiz.env.replay_note.isVisible() and "rtx4090_laptop_16gb.jsonl" in wiz.env.replay_note.text()
    qtbot.waitUntil(lambda: wiz.env.job.exit_code is not None, timeout=120_000)
    disk = [wiz.env.table.topLevelItem(i) for i in range(wiz.env.table.topLevelItemCount())
            if wiz.env.table.topLevelItem(i).text(1) == "free disk"]
    assert disk and str(trainpilot_home / "runs") in disk[0].text(2)


def test_memory_bar_colours_mean_one_component(qtbot):
    """Full and LoRA breakdowns list different components; each colour still names one component."""
    from app.views.wizard.memory_bar import MemoryBar, color_for

    full = {"weights": 1, "gradients": 1, "optimizer_states": 1, "activations": 1, "cuda_context": 1}
    lora = {"weights": 1, "adapter_states": 1, "activations": 1, "cuda_context": 1}
    bar = MemoryBar()
    qtbot.addWidget(bar)
    colours = {}
    for breakdown in (full, lora):
        bar.set_breakdown(breakdown, 10)
        bar.grab()  # paints with the same function the legend uses
        for name, _ in bar.segments:
            colours.setdefault(name, color_for(name))
            assert colours[name] == color_for(name)
    assert color_for("activations") == colours["activations"] and len(set(colours.values())) == len(colours)


def test_every_planned_component_has_a_colour_of_its_own():
    """Walkthrough 8: the plan bar's legend reused three colours (gradients/mlp tile, activations/cuda kernels,
    attention mask/logits loss). Every component real plans break down into — full, LoRA, QLoRA, DeepSpeed offload,
    DPO's reference model, GRPO's sampling, a vision model — has one colour, and no other component has it."""
    from app.views.wizard.memory_bar import color_for
    from trainer import config as tc
    from trainer.core.dotted import nested
    from trainer.hardware.source import planning_snapshot
    from trainer.planning.plan import plan_run

    snap = planning_snapshot(LAPTOP)
    names: set[str] = set()
    for model in ("llama-3.2-1b", "llama-3.1-8b", "qwen2.5-vl-3b"):
        for changes in ({"method.type": "full"}, {"method.type": "lora"}, {"method.type": "qlora"},
                        {"method.type": "full", "deepspeed.enabled": True, "deepspeed.offload_optimizer": True},
                        {"method.type": "lora", "training.objective": "dpo"}):
            cfg = tc.validate(nested({"model.source": model, "model.architecture": model, "model.tokenizer": "demo",
                                      "data.seq_len": 2048, **changes}))
            plan = plan_run(cfg, snap, alternatives=False)
            names |= {k for k, v in plan.breakdown.items() if isinstance(v, (int, float)) and v > 0}
    assert {"gradients", "mlp_tile", "activations", "cuda_kernels", "attention_mask", "logits_loss"} <= names, names
    colours = {name: color_for(name) for name in names}
    assert len(set(colours.values())) == len(colours), sorted(colours.items(), key=lambda kv: kv[1])


def test_a_flagged_combo_box_keeps_its_text_and_says_why_beside_it(qtbot):
    """Walkthrough 8: a flagged Device combo box showed "c…a" (a red border from a style sheet shrank it)."""
    from PySide6 import QtWidgets

    from app.views.wizard.schema_form import SchemaForm
    from trainer import config as tc

    form = SchemaForm(tc.RunConfig())
    area = QtWidgets.QScrollArea()
    area.setWidget(form)
    area.setWidgetResizable(True)
    area.resize(700, 500)
    qtbot.addWidget(area)
    area.show()
    combo = form.editors["device"]
    combo.setCurrentIndex(combo.findData("cuda"))
    wide = combo.sizeHint().width()
    form.show_problems([("device", "device: cuda needs an NVIDIA GPU")])
    QtWidgets.QApplication.processEvents()  # the layout settles
    assert combo.width() >= wide and combo.sizeHint().width() >= wide, (combo.width(), wide)
    assert "cuda needs an NVIDIA GPU" in form._errors["device"].text()
    form.show_problems([])
    assert not form._errors["device"].isVisible()
