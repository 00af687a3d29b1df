"""A run's effective state (trainer/rundir/runstate.py): status.json *and* liveness *and* the last event,
read the same by ``trainpilot-cli status`` and every other reader."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers_train import REPO, cli
from trainer.rundir.checkpoints import MARKER
from trainer.rundir.events import EventWriter, write_status
from trainer.rundir.runstate import LOCK_FILE, read_run_state
from trainer.rundir.runstate import pid_alive as runstate_pid_alive
from trainer.rundir.trained import model_dir, training_pid

pytestmark = pytest.mark.user_start  # children start exactly as a user's (plugins/zygote.py)

# A stand-in supervisor: holds the run folder's lock (the real runlock), says it runs, waits to be killed.
SUPERVISOR = """
import os, sys, time
from pathlib import Path
from trainer.rundir.events import EventWriter, write_status
from trainer.supervisor import runlock
run = Path(sys.argv[1])
runlock.hold(run)
EventWriter(run / "events.jsonl").write("run_started", pid=os.getpid())
EventWriter(run / "events.jsonl").write("step", step=4, max_steps=10, loss=1.0)
write_status(run, state="running", pid=os.getpid(), step=4, max_steps=10)
print("ready", flush=True)
time.sleep(600)
"""


def _run_folder(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("name: x\n")
    return run


def _checkpoint(run: Path, step: int, complete: bool = True) -> Path:
    path = run / "checkpoints" / f"checkpoint-{step}"
    path.mkdir(parents=True)
    if complete:
        (path / MARKER).write_text("{}")
    return path


def _start_supervisor(run: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SUPERVISOR, str(run)], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _status_json(run: Path) -> dict:
    proc = cli("status", run, "--json", timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_supervisor_killed_with_sigkill_reads_failed_everywhere(tmp_path):
    run = _run_folder(tmp_path)
    _checkpoint(run, 2)
    proc = _start_supervisor(run)
    try:
        live = read_run_state(run)
        assert (live.state, live.alive, live.pid, live.resumable) == ("running", True, proc.pid, False)
        assert training_pid(run) == proc.pid
        assert _status_json(run)["state"] == "running"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert json.loads((run / "status.json").read_text())["state"] == "running", "status.json is stale"
    dead = read_run_state(run)
    assert (dead.state, dead.recorded_state, dead.alive, dead.crashed) == ("failed", "running", False, True)
    assert "killed or crashed" in dead.reason and "trainpilot-cli resume" in dead.reason
    assert dead.resumable and dead.checkpoint_step == 2 and dead.step == 4
    assert training_pid(run) is None
    shown = _status_json(run)
    for key in ("state", "alive", "crashed", "reason", "resumable", "checkpoint", "step", "error"):
        assert shown[key] == dead.to_dict()[key], key
    text = cli("status", run, timeout=60).stdout
    assert "failed" in text and "killed or crashed" in text


def test_a_killed_run_without_a_checkpoint_is_not_resumable(tmp_path):
    run = _run_folder(tmp_path)
    _checkpoint(run, 3, complete=False)  # a torn checkpoint (no marker) is never trusted
    proc = _start_supervisor(run)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    state = read_run_state(run)
    assert state.state == "failed" and state.crashed and not state.resumable
    assert state.checkpoint is None and state.model is None


def test_the_lock_decides_over_a_reused_pid(tmp_path):
    # status.json names a pid that is alive (this test's own), but nobody holds the run's lock:
    # the pid was reused, the supervisor is gone.
    run = _run_folder(tmp_path)
    (run / LOCK_FILE).write_text("pid 1")
    write_status(run, state="running", pid=os.getpid())
    state = read_run_state(run)
    assert state.state == "failed" and state.crashed and not state.alive


def test_a_run_folder_without_a_lock_file_asks_the_pid(tmp_path):
    run = _run_folder(tmp_path)
    write_status(run, state="running", pid=os.getpid())
    assert read_run_state(run).state == "running" and read_run_state(run).alive
    write_status(run, state="finished", pid=os.getpid())  # an old run's pid is never asked
    assert not read_run_state(run).alive


def test_an_orphaned_worker_still_trains_after_its_supervisor_died(tmp_path):
    run = _run_folder(tmp_path)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        (run / LOCK_FILE).write_text("pid 1")
        write_status(run, state="running", pid=1, worker_pid=worker.pid)
        state = read_run_state(run)
        assert (state.state, state.alive, state.worker_pid, state.resumable) == ("running", True, worker.pid, False)
        assert "supervisor is gone" in state.reason and "trainpilot-cli stop" in state.reason
        assert training_pid(run) == worker.pid
    finally:
        worker.kill()
        worker.wait(timeout=30)
    assert read_run_state(run).state == "failed"


def test_a_dead_supervisor_whose_worker_finished_reads_finished(tmp_path):
    run = _run_folder(tmp_path)
    (run / LOCK_FILE).write_text("pid 1")
    write_status(run, state="running", pid=1)
    events = EventWriter(run / "events.jsonl")
    events.write("run_started")
    events.write("step", step=10, max_steps=10)
    events.write("finished", step=10, final=str(run / "final"))
    (run / "final").mkdir()
    (run / "final" / "config.json").write_text("{}")
    state = read_run_state(run)
    assert (state.state, state.crashed, state.resumable) == ("finished", False, False)
    assert state.model.label == "final" and state.step == 10


def test_a_gui_recorded_failed_start_shows_its_message(tmp_path):
    run = _run_folder(tmp_path)
    EventWriter(run / "events.jsonl").write("failed", message="data.path: train.jsonl not found", exit_code=2,
                                           phase="start")
    state = read_run_state(run)
    assert (state.state, state.error, state.error_phase) == ("failed", "data.path: train.jsonl not found", "start")
    assert not state.resumable and not state.alive
    assert _status_json(run)["error"] == "data.path: train.jsonl not found"


def test_the_error_is_the_newest_attempts(tmp_path):
    run = _run_folder(tmp_path)
    _checkpoint(run, 2)
    events = EventWriter(run / "events.jsonl")
    events.write("run_started")
    events.write("failed", message="the worker was killed by signal 9")
    write_status(run, state="failed")
    failed = read_run_state(run)
    assert failed.error == "the worker was killed by signal 9" and failed.resumable
    events.write("run_started", resume_from="checkpoint-2")  # resumed: the old error is history
    events.write("stopped", step=3)
    write_status(run, state="stopped")
    assert read_run_state(run).error is None


def test_try_it_loads_final_else_the_newest_complete_checkpoint(tmp_path):
    run = _run_folder(tmp_path)
    assert read_run_state(run).model is None and read_run_state(run).state == "unknown"
    _checkpoint(run, 2)
    _checkpoint(run, 4)
    _checkpoint(run, 6, complete=False)
    state = read_run_state(run)
    assert (state.model.label, state.model.step) == ("checkpoint-4", 4)
    assert model_dir(run) == state.model.path
    (run / "final").mkdir()
    (run / "final" / "adapter_config.json").write_text("{}")
    assert read_run_state(run).model.label == "final" and model_dir(run) == run / "final"


def test_a_half_written_last_event_line_is_tolerated(tmp_path):
    run = _run_folder(tmp_path)
    write_status(run, state="failed")
    with open(run / "events.jsonl", "w") as fh:
        fh.write(json.dumps({"type": "failed", "time": time.time(), "message": "boom"}) + "\n{\"type\": \"wa")
    assert read_run_state(run).error == "boom"


@pytest.mark.slow  # a real training run whose supervisor is killed with SIGKILL
def test_a_real_run_whose_supervisor_is_killed_reads_the_same_in_status_and_runstate(tmp_path):
    from helpers_train import tiny_config, write_config as write_train_config

    cfg = write_train_config(tmp_path / "c.yaml", tiny_config(training={"max_steps": 400},
                                                              checkpoints={"every_steps": 2, "keep_last": 2}))
    run = tmp_path / "run"
    sup = subprocess.Popen([sys.executable, "-m", "trainer", "run", str(cfg), "--run-dir", str(run), "--quiet"],
                           cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while read_run_state(run).checkpoint is None:
        assert time.monotonic() < deadline and sup.poll() is None, "no checkpoint was written"
        time.sleep(0.5)
    assert read_run_state(run).state == "running" and read_run_state(run).pid == sup.pid
    os.kill(sup.pid, signal.SIGKILL)
    sup.wait(timeout=30)
    worker = json.loads((run / "status.json").read_text())["worker_pid"]
    if read_run_state(run).worker_pid is not None:  # the orphaned worker trains on until asked to stop
        assert cli("stop", run, "--wait", "120", timeout=180).returncode == 0
    state = read_run_state(run)
    assert not state.alive and state.state in ("failed", "stopped") and state.recorded_state == "running"
    assert state.resumable and "supervisor is gone" in state.reason
    shown = _status_json(run)
    for key in ("state", "alive", "crashed", "reason", "resumable", "checkpoint", "error"):
        assert shown[key] == state.to_dict()[key], key
    assert not runstate_pid_alive(worker)
