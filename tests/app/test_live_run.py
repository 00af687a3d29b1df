"""One real run through the GUI: Start the CPU demo → steps reach the plots → close the window and
keep training → reopen and re-attach → Stop (checkpoint saved) → Resume → finished.

Real child processes (``python -m trainer demo/stop/resume``), real widgets offscreen.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FIXTURES, SHOWN_MS

from app.views.main_window import CANCEL, KEEP, STOP_AND_SAVE, MainWindow
from trainer.rundir.runstate import pid_alive
from trainer.rundir import events as ev

NO_GPU = str(FIXTURES / "hardware" / "no_gpu.jsonl")
STEPS = 24


def _state(run_dir) -> str | None:
    return (ev.read_status(run_dir) or {}).get("state")


def _window(qtbot) -> MainWindow:
    w = MainWindow(NO_GPU)
    w.ask_close_choice = lambda runs: KEEP  # never a modal question during teardown
    qtbot.addWidget(w)
    w.show()
    return w


@pytest.mark.slow
@pytest.mark.user_start  # stop and resume: children start exactly as a user's (plugins/zygote.py)
def test_start_stop_resume_demo(qtbot):
    w1 = _window(qtbot)
    run_dir = w1.start_demo((f"training.max_steps={STEPS}", "checkpoints.every_steps=8", "training.warmup_steps=2"))
    try:
        _flow(qtbot, w1, run_dir)
    finally:
        w1.runs.kill_tree(run_dir)  # only does something when the test failed midway


def _flow(qtbot, w1: MainWindow, run_dir: str) -> None:
    qtbot.waitUntil(lambda: w1.monitor.current is not None and len(w1.monitor.current.loss) >= 2, timeout=150_000)
    curve = w1.run_view.dashboard.curves["loss"]  # read on the reader thread, drawn at the next tick
    qtbot.waitUntil(lambda: curve.xData is not None and len(curve.xData) >= 2, timeout=SHOWN_MS)
    assert w1.act_stop.isEnabled()
    # Closing during training asks; "keep training in the background" leaves the run alive.
    w1.close()
    assert pid_alive((ev.read_status(run_dir) or {}).get("pid"))
    # Reopening re-attaches to the live run (status.json pid alive) and can stop it.
    w2 = _window(qtbot)
    assert str(w2.monitor.current.run_dir) == str(Path(run_dir).resolve())
    qtbot.waitUntil(lambda: w2.act_stop.isEnabled(), timeout=SHOWN_MS)
    w2.stop_selected()
    qtbot.waitUntil(lambda: w2.act_stop.text() == "Saving checkpoint…", timeout=SHOWN_MS)
    qtbot.waitUntil(lambda: _state(run_dir) == "stopped", timeout=90_000)
    assert list((Path(run_dir) / "checkpoints").glob("checkpoint-*")), "Stop saved no checkpoint"
    stopped_at = ev.read_status(run_dir)["step"]
    assert stopped_at < STEPS
    qtbot.waitUntil(lambda: w2.act_resume.isEnabled(), timeout=SHOWN_MS)
    w2.resume_selected()
    qtbot.waitUntil(lambda: _state(run_dir) == "finished", timeout=150_000)
    qtbot.waitUntil(lambda: (w2.monitor.current.last_step or {}).get("step") == STEPS, timeout=SHOWN_MS)
    curve = w2.run_view.dashboard.curves["loss"]
    qtbot.waitUntil(lambda: curve.xData is not None and curve.xData[-1] == STEPS, timeout=SHOWN_MS)
    qtbot.waitUntil(lambda: "finished" in w2.run_view.dashboard.headline.text(), timeout=SHOWN_MS)
    assert not w2.act_stop.isEnabled()
    w2.hardware.stop()


@pytest.mark.slow
def test_wizard_start_runs_and_shows_the_run(qtbot):
    """The wizard's Start on this CPU machine: the main window launches `run CONFIG --run-dir DIR`,
    opens the new run folder, and the run finishes."""
    w = _window(qtbot)
    w.open_wizard()
    wiz = w.wizard
    qtbot.waitUntil(lambda: w.hardware.latest is not None, timeout=SHOWN_MS)  # first snapshot: ms when idle, seconds on a loaded CI machine
    wiz.next()
    qtbot.waitUntil(lambda: wiz.state.values["data.seq_len"] == 512, timeout=SHOWN_MS)  # the demo model reads 512
    wiz.next()
    wiz.next()
    form = wiz.plan.advanced
    for key, text in (("training.max_steps", "2"), ("data.seq_len", "64"), ("checkpoints.every_steps", "1")):
        form.editors[key].edit.setText(text)
        form.editors[key].edit.editingFinished.emit()
    wiz.next()
    qtbot.waitUntil(lambda: wiz.review.start_button.isEnabled(), timeout=SHOWN_MS)
    run_dir = wiz.review.run_dir.text()
    wiz.review.start_button.click()
    try:
        qtbot.waitUntil(lambda: w.monitor.current is not None
                        and str(w.monitor.current.run_dir) == str(Path(run_dir).resolve()), timeout=60_000)
        qtbot.waitUntil(lambda: _state(run_dir) == "finished", timeout=150_000)
        qtbot.waitUntil(lambda: "finished" in w.run_view.dashboard.headline.text(), timeout=SHOWN_MS)
        assert "step 2 of 2" in w.run_view.dashboard.headline.text()
    finally:
        w.runs.kill_tree(run_dir)
        w.hardware.stop()


@pytest.mark.slow
@pytest.mark.user_start  # stop and resume: children start exactly as a user's (plugins/zygote.py)
def test_closing_during_training_cancel_then_stop_and_save(qtbot):
    """The close question's other two answers: Cancel keeps the window open and the run going;
    "Stop and save" closes the window, and the run saves a checkpoint at its current step and stops."""
    w = _window(qtbot)
    run_dir = w.start_demo((f"training.max_steps={STEPS * 10}", "checkpoints.every_steps=1000",
                            "training.warmup_steps=2"))
    try:
        qtbot.waitUntil(lambda: w.monitor.current is not None and len(w.monitor.current.loss) >= 2, timeout=150_000)
        asked = []
        w.ask_close_choice = lambda runs: asked.append(list(runs)) or CANCEL
        assert not w.close()
        assert w.isVisible() and asked and str(Path(asked[0][0]).resolve()) == str(Path(run_dir).resolve())
        assert _state(run_dir) == "running"
        w.ask_close_choice = lambda runs: STOP_AND_SAVE
        assert w.close()  # waits (the event loop running) until the run has saved and stopped
        status = ev.read_status(run_dir)
        assert status["state"] == "stopped"
        assert not pid_alive(status.get("pid")) and not pid_alive(status.get("worker_pid")), "a live worker is left"
        ckpts = sorted(Path(run_dir, "checkpoints").glob("checkpoint-*"))
        assert ckpts and ckpts[-1].name == f"checkpoint-{status['step']}", "no checkpoint at the stop step"
        assert 0 < status["step"] < STEPS * 10
    finally:
        w.runs.kill_tree(run_dir)
        w.hardware.stop()


@pytest.mark.slow
def test_the_wizard_trains_a_vision_language_model_on_picture_records(qtbot, tmp_path, monkeypatch):
    """Issue 28: a tiny SmolVLM-shaped model (its real processor, tests/real_vlms.py) and image chat records, typed
    into the wizard as a user would: the Data page counts the pictures, LoRA is chosen, Start runs it to the end and the
    run's final model keeps its processor."""
    import real_vlms as rv

    from test_vision_train import write_data

    monkeypatch.setenv("TRAINPILOT_CACHE", str(tmp_path / "cache"))
    model, data = rv.family_dir("smolvlm"), write_data(tmp_path)
    w = _window(qtbot)
    w.open_wizard()
    wiz = w.wizard
    qtbot.waitUntil(lambda: w.hardware.latest is not None, timeout=SHOWN_MS)
    wiz.next()
    wiz.model.source.setText(str(model))
    qtbot.waitUntil(lambda: "parameters" in wiz.model.facts.text(), timeout=SHOWN_MS)
    wiz.next()
    wiz.data.path.setText(str(data))
    wiz.data.path.editingFinished.emit()
    qtbot.waitUntil(lambda: wiz.data.report is not None, timeout=120_000)
    pictures = wiz.data.report["pictures"]
    assert pictures["pictures"] == 8 and pictures["image_tokens_max_per_sample"] > 0, pictures
    assert "8 pictures" in wiz.data.stats.text() and "image tokens" in wiz.data.tokens.text()
    wiz.next()
    lora = next(b for b in wiz.plan.methods.buttons() if b.property("method") == "lora")
    lora.click()
    form = wiz.plan.advanced
    for key, text in (("training.max_steps", "2"), ("data.seq_len", "128"), ("checkpoints.every_steps", "1")):
        form.editors[key].edit.setText(text)
        form.editors[key].edit.editingFinished.emit()
    qtbot.waitUntil(lambda: wiz.state.values["method.type"] == "lora" and not wiz.state.planning, timeout=SHOWN_MS)
    wiz.next()
    qtbot.waitUntil(lambda: wiz.review.start_button.isEnabled(), timeout=SHOWN_MS)
    run_dir = wiz.review.run_dir.text()
    wiz.review.start_button.click()
    try:
        qtbot.waitUntil(lambda: _state(run_dir) == "finished", timeout=240_000)
        qtbot.waitUntil(lambda: "finished" in w.run_view.dashboard.headline.text(), timeout=SHOWN_MS)
        final = Path(run_dir) / "final"
        assert (final / "adapter_model.safetensors").is_file()
        assert (final / "preprocessor_config.json").is_file() or (final / "processor_config.json").is_file()
    finally:
        w.runs.kill_tree(run_dir)
        w.hardware.stop()
