"""Suite-wide: one folder per test session shared by every pytest-xdist worker (``shared_once``), removed when the
session ends. The suite runs on two xdist workers (``pyproject.toml``'s addopts: ``-n 2 --dist loadgroup``); the GUI
tests that measure the event loop run in one group (``@pytest.mark.xdist_group("gui-timing")``), one after another."""
from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

SESSION_ENV = "TRAINPILOT_TEST_SESSION"


def pytest_configure(config):
    """The controller (or a run without xdist) names the session before the workers start; workers inherit it."""
    if not hasattr(config, "workerinput"):
        os.environ.setdefault(SESSION_ENV, uuid.uuid4().hex[:12])


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput") and os.environ.get(SESSION_ENV):
        shutil.rmtree(Path(tempfile.gettempdir()) / f"tp-session-{os.environ[SESSION_ENV]}", ignore_errors=True)
