"""The GUI's one child-process helper (``app.ops.child``) with real child processes: JSON lines on stdout
arrive one by one while stderr chatter stays apart, the CLI's own error message is what ``failed``
carries, cancel kills the whole tree (a grandchild too), a program that cannot start fails once."""
from __future__ import annotations

import sys
import textwrap

import psutil

from app.ops.child import ChildProcess, error_message
from app.ops.commands import Job

CHATTY = textwrap.dedent("""
    import json, sys, time
    for i in range(3):
        sys.stderr.write(f"progress {i}%\\r")
        sys.stderr.flush()
        print(json.dumps({"n": i}), flush=True)
        print("not json", flush=True)
        time.sleep(0.05)
    sys.stderr.write("\\ntrainpilot-cli: data.path: no such file; pass an existing file\\n")
    sys.exit(2)
""")

TREE = textwrap.dedent("""
    import json, subprocess, sys, time
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    print(json.dumps({"grandchild": grandchild.pid}), flush=True)
    time.sleep(120)
""")


def _record(child: ChildProcess) -> dict:
    seen = {"lines": [], "failed": [], "done": []}
    child.line.connect(seen["lines"].append)
    child.failed.connect(seen["failed"].append)
    child.done.connect(lambda code, out, err: seen["done"].append((code, out, err)))
    return seen


def test_json_lines_arrive_apart_from_stderr_and_failed_carries_the_cli_message(qtbot):
    child = ChildProcess([sys.executable, "-c", CHATTY])
    seen = _record(child)
    child.start()
    qtbot.waitUntil(lambda: bool(seen["done"]), timeout=30000)
    assert seen["lines"] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert seen["failed"] == ["trainpilot-cli: data.path: no such file; pass an existing file"]
    code, out, err = seen["done"][0]
    assert code == 2 and "progress" not in out and '{"n": 2}' in out and "progress 2%" in err
    qtbot.wait(100)
    assert len(seen["done"]) == 1 and len(seen["failed"]) == 1


def test_a_real_cli_error_is_the_message(qtbot, tmp_path):
    bad = Job("status", str(tmp_path / "nowhere"))
    seen = _record(bad)
    bad.start()
    qtbot.waitUntil(lambda: bool(seen["done"]), timeout=60000)
    assert seen["done"][0][0] == 2
    assert seen["failed"][0].startswith("trainpilot-cli:") and "nowhere" in seen["failed"][0]
    assert "Traceback" not in seen["failed"][0]


def test_cancel_kills_the_whole_tree_and_does_not_report_a_failure(qtbot):
    child = ChildProcess([sys.executable, "-c", TREE])
    seen = _record(child)
    child.start()
    qtbot.waitUntil(lambda: bool(seen["lines"]), timeout=30000)
    grandchild = psutil.Process(seen["lines"][0]["grandchild"])
    parent = psutil.Process(child.proc.processId())
    child.cancel()
    qtbot.waitUntil(lambda: bool(seen["done"]), timeout=10000)
    assert child.cancelled and seen["failed"] == [] and not child.running()
    gone, alive = psutil.wait_procs([grandchild, parent], timeout=10)
    assert alive == [], "QProcess.kill() alone leaves the grandchild running"


def test_a_program_that_cannot_start_fails_once(qtbot, tmp_path):
    child = ChildProcess([str(tmp_path / "no-such-program")])
    seen = _record(child)
    child.start()
    qtbot.waitUntil(lambda: bool(seen["done"]), timeout=10000)
    qtbot.wait(100)
    assert [d[0] for d in seen["done"]] == [127] and len(seen["failed"]) == 1
    assert "could not start" in seen["failed"][0]


def test_error_message_prefers_the_cli_line_then_the_last_lines():
    err = "usage: trainpilot-cli ...\ntrainpilot-cli: error: the following arguments are required: --to\n"
    assert error_message(err, 2) == "trainpilot-cli: error: the following arguments are required: --to"
    assert error_message("trainpilot: loaded the model\nboom\n", 1) == "boom"
    assert error_message("", 3) == "exit code 3"


def test_deleting_the_owner_of_a_running_child_ends_its_whole_tree(qtbot):
    import shiboken6
    from PySide6 import QtCore

    owner = QtCore.QObject()
    child = ChildProcess([sys.executable, "-c", TREE], parent=owner)
    seen = _record(child)
    child.start()
    qtbot.waitUntil(lambda: bool(seen["lines"]), timeout=30000)
    grandchild = psutil.Process(seen["lines"][0]["grandchild"])
    shiboken6.delete(owner)  # a dialog closed with its child still running
    gone, alive = psutil.wait_procs([grandchild], timeout=10)
    assert alive == [], "the grandchild outlived its owner"
