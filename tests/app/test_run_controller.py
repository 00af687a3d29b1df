"""The last resort: a run that ignores a graceful stop is offered for killing after the timeout,
and killing takes its whole process tree (a real supervisor-like parent with a child)."""
from __future__ import annotations

import json
import subprocess
import sys

import psutil
import pytest

from app.ops.run_controller import RunController

pytestmark = pytest.mark.user_start  # children start exactly as a user's (plugins/zygote.py)

# A stand-in supervisor that ignores STOP and has a child of its own (both sleep).
IGNORES_STOP = ("import subprocess, sys, time; "
                "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(120)")


def test_stop_timeout_offers_kill_and_kill_takes_the_tree(qtbot, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("name: stand-in\n")  # what makes it a run folder for the CLI
    parent = subprocess.Popen([sys.executable, "-c", IGNORES_STOP], start_new_session=True)
    try:
        qtbot.waitUntil(lambda: len(psutil.Process(parent.pid).children()) == 1, timeout=10000)
        child = psutil.Process(parent.pid).children()[0]
        (run / "status.json").write_text(json.dumps({"state": "running", "pid": parent.pid, "step": 3}))
        ctl = RunController(stop_timeout_s=1.0)
        assert ctl.supervisor_pid(str(run)) == parent.pid
        assert set(ctl.tree_pids(str(run))) == {parent.pid, child.pid}
        with qtbot.waitSignal(ctl.stop_overdue, timeout=20000) as sig:
            ctl.stop(str(run))  # the real `trainpilot-cli stop` writes STOP; nobody obeys it
            assert ctl.is_stopping(str(run))
        assert sig.args == [str(run)] and (run / "STOP").exists()
        with qtbot.waitSignal(ctl.killed, timeout=20000) as killed:
            ctl.kill_tree(str(run))  # kills and waits on a worker thread: returns at once
        assert killed.args == [str(run), 2]
        assert parent.wait(timeout=10) is not None
        assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
        assert not ctl.is_stopping(str(run))
    finally:
        if parent.poll() is None:
            parent.kill()


def test_the_status_bar_says_the_run_ended_instead_of_saving_checkpoint(qtbot, fixture_run):
    """A stop requested while the controller's own child runs: when the child exits, the status bar
    message says how the run ended; it does not keep "Saving checkpoint…"."""
    run = str(fixture_run("crashed_run"))  # `resume` refuses it at once (exit 2): a real, short child
    ctl = RunController()
    messages = []
    ctl.message.connect(messages.append)
    ctl.resume(run)
    assert ctl.stop(run) and messages[-1].startswith("Saving checkpoint…")
    with qtbot.waitSignal(ctl.exited, timeout=60000):
        pass
    assert messages[-1] == "Run crashed_run failed." and not ctl.is_stopping(run)
