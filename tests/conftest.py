"""Suite-wide: one folder per test session shared by every pytest-xdist worker (``shared_once``), removed when the
session ends. The suite runs on two xdist workers (``pyproject.toml``'s addopts: ``-n 2 --dist loadgroup``); the GUI
tests that measure the event loop run in one group (``@pytest.mark.xdist_group("gui-timing")``), one after another."""
from __future__ import annotations

import faulthandler
import os
import re
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

SESSION_ENV = "TRAINPILOT_TEST_SESSION"

# One thread per process for PyTorch (and everything else OpenMP) in this session and its children. The suite runs two
# xdist workers on a 2-core machine, each with its training children: with PyTorch's default (a thread per core) the
# thread teams wait for each other at every operation, spinning, while the other worker's processes hold the cores —
# the 60-step demo run took 43 s of CPU (76 s wall) at load 8 with the default and 9.5 s (19 s) with one thread.
# Results do not depend on it (every comparison in the suite runs both sides in this same environment); a developer's
# own OMP_NUM_THREADS wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")


_CONTROLLER = [True]  # False in an xdist worker (set by pytest_configure)
_CONFIG: list = [None]
_WATCHDOG_OUT: list = [None]  # where the hang watchdog writes (pytest_configure)

# A test phase that takes longer than this is named in the output as it ends (the controller's terminal): when CI is
# cut off at its time limit, the log's tail still says where the time went. Locally the slowest test takes ~90 s.
SLOW_LINE_S = 60.0


def pytest_configure(config):
    """The controller (or a run without xdist) names the session before the workers start; workers inherit it."""
    _CONTROLLER[0] = not hasattr(config, "workerinput")
    _CONFIG[0] = config
    # the terminal's stderr, kept before any test captures fd 2: what the watchdog prints must outlive the process
    _WATCHDOG_OUT[0] = os.fdopen(os.dup(sys.__stderr__.fileno()), "w")
    if _CONTROLLER[0]:
        os.environ.setdefault(SESSION_ENV, uuid.uuid4().hex[:12])


# The zygote's own imports cost ~10 CPU-seconds a worker: it pays where the selection has tests that start heavy
# children (those are marked slow), not in a `-m "not slow"` loop (1 min 35 s without it, 1 min 51 s with it).
ZYGOTE_MIN_SLOW = 10


def pytest_collection_finish(session):
    """Where tests run (each xdist worker, or a run without workers), the zygote starts once collection is done:
    its environment is then the one the tests' children inherit (test modules set variables as they are imported)."""
    slow = sum(1 for item in session.items if item.get_closest_marker("slow") is not None)
    if (not _CONTROLLER[0] or not getattr(session.config.option, "numprocesses", None)) and slow >= ZYGOTE_MIN_SLOW:
        _start_zygote()


ZYGOTE_DIR = Path(__file__).with_name("zygote")
_ZYGOTE: list = [None, None]  # the server's Popen and its folder


def _start_zygote() -> None:
    """The session's pre-imported interpreter (``tests/zygote/zygote_server.py``: why, and what it forks): the heavy
    ``python -m trainer…`` children of this process's tests start from it instead of importing torch and transformers
    each (a standby worker's start alone was 5.5 s of CPU on the 2-core machine; the whole suite went from 26 min to
    17 min 36 s). It imports in the background; a child started before it answers starts as usual. Off with
    ``TRAINPILOT_TEST_ZYGOTE=0``, and where there is no fork or pidfd (Windows, macOS)."""
    import subprocess

    from helpers_ci import zygote_possible

    if os.environ.get("TRAINPILOT_TEST_ZYGOTE", "1") == "0" or not zygote_possible():
        return
    folder = tempfile.mkdtemp(prefix="tpz-")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ZYGOTE_DIR), *[p for p in os.environ.get("PYTHONPATH", "")
                                                                  .split(os.pathsep) if p]])
    os.environ["TRAINPILOT_ZYGOTE_SOCKET"] = os.path.join(folder, "socket")
    log = os.environ.get("TRAINPILOT_ZYGOTE_LOG", "")
    with open(os.path.join(folder, "server.log"), "wb") as out:
        _ZYGOTE[:] = [subprocess.Popen([sys.executable, str(ZYGOTE_DIR / "zygote_server.py"),
                                        os.environ["TRAINPILOT_ZYGOTE_SOCKET"], *([log] if log else [])],
                                       stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=dict(os.environ),
                                       start_new_session=True), folder]


def _stop_zygote() -> None:
    proc, folder = _ZYGOTE
    if proc is not None:
        proc.kill()
        proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
        _ZYGOTE[:] = [None, None]


def pytest_timeout_set_timer(item, settings):
    """A watchdog under pytest-timeout's own timer (its hook: the timeout as it resolved it from the marker, the
    command line, the environment and the ini): when a test outlives it by two minutes, faulthandler prints every
    thread's stack and ends the process. pytest-timeout's alarm is a Python signal handler, which never runs while the
    main thread waits inside C/C++ holding the GIL (a Qt wait, a lock): such a test would hang its xdist worker, and
    the whole suite, until CI's time limit. faulthandler's watchdog is a C thread; xdist replaces the worker.
    Returns None, so pytest-timeout sets its own timer too."""
    faulthandler.dump_traceback_later(settings.timeout + 120, exit=True, file=_WATCHDOG_OUT[0] or sys.stderr)


def pytest_timeout_cancel_timer(item):
    """With pytest-timeout's timer (the test ended, or pdb was entered): the watchdog stops too. Returns None."""
    faulthandler.cancel_dump_traceback_later()


def pytest_unconfigure(config):
    _stop_zygote()
    if not hasattr(config, "workerinput") and os.environ.get(SESSION_ENV):
        shutil.rmtree(Path(tempfile.gettempdir()) / f"tp-session-{os.environ[SESSION_ENV]}", ignore_errors=True)


MEASURED_SLOW = Path(__file__).with_name("measured_slow.txt")


def pytest_collection_modifyitems(config, items):
    """Tests listed in ``measured_slow.txt`` (measured at >= 3.5 s each) are marked slow: ``-m "not slow"`` stays a
    quick loop, and the full run (CI) runs them all the same."""
    import pytest

    listed = {re.sub(r"@[\w-]+$", "", line.strip()) for line in MEASURED_SLOW.read_text(encoding="utf-8").splitlines()
              if line.strip() and not line.startswith("#")}  # an id as a run logs it may end in its xdist group
    for item in items:
        if item.nodeid in listed:
            item.add_marker(pytest.mark.slow)
    if getattr(config.option, "loadgroup", False):  # an xdist worker under --dist loadgroup
        _group_ids(items)


def _group_ids(items) -> None:
    """The ``xdist_group`` of a test as the "@group" suffix of its id, which ``--dist loadgroup`` schedules by (one
    worker per group). pytest-xdist 3.8.0 adds it by setting ``item._nodeid``, which pytest 9 no longer reads (an
    item's id is ``item._id``): every group was silently ignored — the GUI timing tests ran beside each other and the
    installers' tests installed twice. Added here as pytest 9 keeps ids, where xdist's did not take."""
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # pytest 8: xdist's own suffix works
        return
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if names and "@" not in item.nodeid.rsplit("::", 1)[-1]:
            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(names)}")


def pytest_runtest_logreport(report):
    """With ``TRAINPILOT_TEST_TIMES=FILE``, each test's phase durations are appended to FILE as they finish (one line
    per phase: seconds, phase, outcome, test id, xdist worker): where the suite's time goes, readable while it runs.
    Written by the controller only (xdist hands it every worker's reports), so each phase is one line."""
    if _CONTROLLER[0] and report.duration >= SLOW_LINE_S and _CONFIG[0] is not None:
        reporter = _CONFIG[0].pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"[{report.duration:.0f} s {report.when}] {report.nodeid}")
    out = os.environ.get("TRAINPILOT_TEST_TIMES")
    if out and _CONTROLLER[0]:
        node = getattr(report, "node", None)
        worker = getattr(getattr(node, "gateway", None), "id", "main")
        with open(out, "a", encoding="utf-8") as f:
            f.write(f"{report.duration:.2f}\t{report.when}\t{report.outcome}\t{report.nodeid}\t{worker}\n")


@pytest.fixture
def cuda_torch(monkeypatch):
    """(Here for every test: the planner's tests judge a replayed GPU too.) This machine as a GPU recording describes
    it: PyTorch built for CUDA beside the replayed GPU. Stands in
    ``torch.version`` the way ``trainer.core.capabilities`` reads an imported torch (the development machine has
    a CPU-only build; without this, Review rightly blocks every replayed-GPU plan on the device)."""
    import types

    monkeypatch.setitem(sys.modules, "torch.version",
                        types.SimpleNamespace(__version__="2.13.0+cu128", cuda="12.8", hip=None))
