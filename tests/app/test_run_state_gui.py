"""Every reader asks runstate (issue 20): a killed run reads the same in the runs list, the dashboard,
the status bar and ``trainpilot-cli status``; Resume only when resumable, Stop only while live; the
Try it tab follows the run's state without reselecting it, and shows and keeps the chosen checkpoint."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import FIXTURES

from app.views.main_window import MainWindow
from app.views.try_it import BUSY_TEXT, NO_MODEL_TEXT, TryItTab
from trainer.core import entrypoints
from trainer.rundir.checkpoints import MARKER
from trainer.rundir.runstate import read_run_state

NO_GPU = str(FIXTURES / "hardware" / "no_gpu.jsonl")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _status(run: Path, state: str, pid: int | None, step: int = 24) -> None:
    (run / "status.json").write_text(json.dumps({"state": state, "pid": pid, "step": step, "max_steps": 24,
                                                 "attempt": 1, "updated": 1.0}))


def _checkpoint(run: Path, step: int) -> None:
    folder = run / "checkpoints" / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / MARKER).write_text(json.dumps({"step": step}))


def _killed_run(fixture_run) -> Path:
    """A demo run whose supervisor was killed with -9: status.json still says running, nobody lives."""
    run = fixture_run("cpu_demo")
    lines = (run / "events.jsonl").read_text().splitlines(keepends=True)
    (run / "events.jsonl").write_text("".join(ln for ln in lines if '"type": "finished"' not in ln
                                              and '"type":"finished"' not in ln))
    _status(run, "running", _dead_pid(), step=16)
    _checkpoint(run, 16)
    return run


def _window(qtbot) -> MainWindow:
    w = MainWindow(NO_GPU)
    qtbot.addWidget(w)
    w.show()
    return w


def _row_state(w: MainWindow, run: Path) -> str | None:
    for i in range(w.run_list.topLevelItemCount()):
        item = w.run_list.topLevelItem(i)
        if item.text(0) == run.name:
            return item.text(1)
    return None


def _cli_state(run: Path) -> str:
    out = subprocess.run(entrypoints.python_m(entrypoints.CLI, "status", str(run), "--json"),
                         capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["state"]


def test_a_killed_run_reads_failed_everywhere_and_resumes_from_its_checkpoint(qtbot, fixture_run):
    run = _killed_run(fixture_run)
    w = _window(qtbot)
    w.open_run(str(run))
    qtbot.waitUntil(lambda: _row_state(w, run) is not None and w.monitor.current.run_state is not None, timeout=10000)
    w._on_tick()
    headline = w.run_view.dashboard.headline.text()
    assert _row_state(w, run) == "failed" == _cli_state(run)
    assert headline.startswith("failed (Resume continues from checkpoint 16) · step 24 of 24"), headline
    assert w.state_label.text() == f"{run.name}: failed"
    assert "killed or crashed" in w.run_view.failure.text()
    assert w.act_resume.isEnabled() and not w.act_stop.isEnabled()
    assert "killed or crashed" in w.run_list.topLevelItem(0).toolTip(1)
    w.hardware.stop()


def test_resume_needs_a_checkpoint_and_stop_needs_a_live_run(qtbot, fixture_run):
    run = fixture_run("crashed_run")  # failed at step 7, no checkpoint
    w = _window(qtbot)
    w.open_run(str(run))
    qtbot.waitUntil(lambda: w.monitor.current.run_state is not None, timeout=10000)
    w._on_tick()
    assert not w.act_resume.isEnabled() and not w.act_stop.isEnabled()
    assert w.act_resume.toolTip() == "No complete checkpoint: nothing to resume from"
    assert "no complete checkpoint to resume from" in w.run_view.dashboard.headline.text()
    _checkpoint(run, 5)
    qtbot.waitUntil(lambda: (w._on_tick(), w.act_resume.isEnabled())[1], timeout=10000)
    assert w.act_resume.toolTip() == "Continue from checkpoint 5"
    _status(run, "running", os.getpid(), step=7)  # a supervisor that lives (this process stands in)
    qtbot.waitUntil(lambda: (w._on_tick(), w.act_stop.isEnabled())[1], timeout=10000)
    assert not w.act_resume.isEnabled() and w.state_label.text() == f"{run.name}: running"
    qtbot.waitUntil(lambda: _row_state(w, run) == "running", timeout=10000)
    _status(run, "stopped", None, step=7)  # else closing the window asks what to do with the "live" run
    qtbot.waitUntil(lambda: not w.monitor.current.is_alive(), timeout=10000)
    w.hardware.stop()


def test_try_it_follows_the_runs_state_and_keeps_the_chosen_checkpoint(qtbot, fixture_run):
    run = fixture_run("cpu_demo")
    _status(run, "running", os.getpid(), step=4)
    tab = TryItTab()
    qtbot.addWidget(tab)
    tab.show()
    tab.bind(run)
    tab.follow(read_run_state(run))
    assert tab.status.text() == BUSY_TEXT and not tab.send_button.isEnabled()
    _checkpoint(run, 8)
    _checkpoint(run, 16)
    _status(run, "stopped", None, step=16)  # stopped: the checkpoints can be tried, no reselecting
    tab.follow(read_run_state(run))
    assert [tab.checkpoint.itemText(i) for i in range(tab.checkpoint.count())] == ["checkpoint 16", "checkpoint 8"]
    assert tab.send_button.isEnabled() and tab.status.text() == ""
    tab.checkpoint.setCurrentIndex(1)  # the user picks the older checkpoint
    (run / "final").mkdir()
    (run / "final" / "config.json").write_text("{}")
    _status(run, "finished", None)
    tab.follow(read_run_state(run))
    assert [tab.checkpoint.itemText(i) for i in range(tab.checkpoint.count())] == \
        ["final", "checkpoint 16", "checkpoint 8"]
    assert tab.checkpoint.currentText() == "checkpoint 8" and tab.send_button.isEnabled()
    tab.prompt.setPlainText("hello")
    assert tab.send()
    assert tab.tuned.title.text() == "<b>Tuned model (checkpoint 8)</b>"
    tab.stop()
    qtbot.waitUntil(lambda: not tab.busy(), timeout=10000)
    _status(run, "running", os.getpid(), step=17)  # resumed: refused before anyone clicks
    tab.follow(read_run_state(run))
    assert tab.status.text() == BUSY_TEXT and not tab.send_button.isEnabled()


def test_try_it_says_no_model_yet_for_a_run_without_one(qtbot, fixture_run):
    run = fixture_run("crashed_run")
    tab = TryItTab()
    qtbot.addWidget(tab)
    tab.bind(run)
    tab.follow(read_run_state(run))
    assert tab.status.text() == NO_MODEL_TEXT and not tab.send_button.isEnabled()
