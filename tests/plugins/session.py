"""The test session: one folder shared by every pytest-xdist worker (``shared_once``, and TrainPilot's cache), removed
when the session ends, and one thread per process for PyTorch in the session and its children."""
from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

SESSION_ENV = "TRAINPILOT_TEST_SESSION"

# One thread per process for PyTorch (and everything else OpenMP) in this session and its children. The suite runs two
# xdist workers on a 2-core machine, each with its training children: with PyTorch's default (a thread per core) the
# thread teams wait for each other at every operation, spinning, while the other worker's processes hold the cores —
# the 60-step demo run took 43 s of CPU (76 s wall) at load 8 with the default and 9.5 s (19 s) with one thread.
# Results do not depend on it (every comparison in the suite runs both sides in this same environment); a developer's
# own OMP_NUM_THREADS wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def is_controller(config) -> bool:
    """True in the process that runs the session: xdist's controller, or the only process without workers."""
    return not hasattr(config, "workerinput")


def pytest_configure(config):
    """The controller names the session before the workers start; the workers inherit the name."""
    if is_controller(config):
        os.environ.setdefault(SESSION_ENV, uuid.uuid4().hex[:12])
        # TrainPilot's own cache (measured token lengths, scans, structures) is the session's, not the user's: a plan
        # follows the data's lengths cached there, so a cache left by another run (a plan or run by hand, an earlier
        # session) changed what the planner tests saw. A developer's own TRAINPILOT_CACHE wins.
        os.environ.setdefault("TRAINPILOT_CACHE", str(Path(tempfile.gettempdir()) /
                                                      f"tp-session-{os.environ[SESSION_ENV]}" / "cache"))


def pytest_unconfigure(config):
    if is_controller(config) and os.environ.get(SESSION_ENV):
        shutil.rmtree(Path(tempfile.gettempdir()) / f"tp-session-{os.environ[SESSION_ENV]}", ignore_errors=True)
