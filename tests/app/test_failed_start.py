"""A start that failed before the supervisor made its run folder: recorded as a listed failed run with
its message (the typed ``failed`` record), and a folder that cannot be written never raises."""
from __future__ import annotations

from app.model import failed_start
from trainer.rundir.runstate import read_run_state


def test_a_failed_start_is_recorded_with_its_message(tmp_path):
    config = tmp_path / "mine.yaml"
    config.write_text("name: mine\n")
    run = tmp_path / "runs" / "mine"
    assert failed_start.record(str(run), str(config), 2, "trainpilot-cli: data.path: x.jsonl not found\n", None)
    state = read_run_state(run)
    assert (state.state, state.error, state.error_phase) == (
        "failed", "trainpilot-cli: data.path: x.jsonl not found", "start"), state
    assert (run / "config.yaml").read_text() == "name: mine\n" and "not found" in (run / "train.log").read_text()


def test_a_run_folder_that_cannot_be_written_is_not_an_exception(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert failed_start.record(str(blocker / "runs" / "mine"), None, 2, "cannot write", None) is False
