"""The session's pre-imported interpreter for heavy children (``tests/zygote/zygote_server.py`` says what and why),
and the ``user_start`` marker for the tests whose children must start exactly as a user's do.

Where tests run (each xdist worker, or a run without workers) the zygote starts once collection is done — its
environment is then the one the tests' children inherit (test modules set variables as they are imported) — and
only where the selection holds at least ``ZYGOTE_MIN_SLOW`` slow tests. Off with ``TRAINPILOT_TEST_ZYGOTE=0``, and
where there is no fork or pidfd (Windows, macOS)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from plugins.session import is_controller

ZYGOTE_DIR = Path(__file__).resolve().parents[1] / "zygote"
OFF = "TRAINPILOT_TEST_ZYGOTE"  # "0": every child starts as usual (the shim, tests/zygote/sitecustomize.py, asks it)
# The zygote's own imports cost ~10 CPU-seconds a worker: it pays where the selection has tests that start heavy
# children (those are marked slow), not in a `-m "not slow"` loop (1 min 35 s without it, 1 min 51 s with it).
ZYGOTE_MIN_SLOW = 10
USER_START = "user_start"
_SERVER: list = [None, None]  # the server's Popen and its folder


def pytest_configure(config):
    config.addinivalue_line("markers", f"{USER_START}: the test's children start exactly as a user's do — the zygote "
                            "stands aside (stop, resume, kill, the OOM ladder, standby, the GUI's run controller)")


def pytest_collection_finish(session):
    slow = sum(1 for item in session.items if item.get_closest_marker("slow") is not None)
    runs_tests = not is_controller(session.config) or not getattr(session.config.option, "numprocesses", None)
    if runs_tests and slow >= ZYGOTE_MIN_SLOW:
        _start()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test marked ``user_start`` runs with ``TRAINPILOT_TEST_ZYGOTE=0`` from its first fixture to its last
    teardown, so every child it (or its fixtures) starts — the CLI, the supervisor, the worker and its standby —
    starts as a user's: the process-lifecycle tests check the start-up users get, not the stand-in's."""
    if item.get_closest_marker(USER_START) is None:
        return (yield)
    before = os.environ.get(OFF)
    os.environ[OFF] = "0"
    try:
        return (yield)
    finally:
        if before is None:
            os.environ.pop(OFF, None)
        else:
            os.environ[OFF] = before


def pytest_unconfigure(config):
    proc, folder = _SERVER
    if proc is not None:
        proc.kill()
        proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
        _SERVER[:] = [None, None]


def _start() -> None:
    """Start the server in the background (it imports torch and transformers; a child started before it answers
    starts as usual) and put the shim on the children's ``PYTHONPATH``."""
    from helpers_ci import zygote_possible

    if os.environ.get(OFF, "1") == "0" or not zygote_possible():
        return
    folder = tempfile.mkdtemp(prefix="tpz-")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ZYGOTE_DIR), *[p for p in os.environ.get("PYTHONPATH", "")
                                                                  .split(os.pathsep) if p]])
    os.environ["TRAINPILOT_ZYGOTE_SOCKET"] = os.path.join(folder, "socket")
    log = os.environ.get("TRAINPILOT_ZYGOTE_LOG", "")
    with open(os.path.join(folder, "server.log"), "wb") as out:
        _SERVER[:] = [subprocess.Popen([sys.executable, str(ZYGOTE_DIR / "zygote_server.py"),
                                        os.environ["TRAINPILOT_ZYGOTE_SOCKET"], *([log] if log else [])],
                                       stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=dict(os.environ),
                                       start_new_session=True), folder]
