"""Expensive test inputs (trained runs, converted exports) built once per test session, whatever the number of
pytest-xdist workers: the first worker to ask builds under a file lock, the others wait and reuse the result.
The folder lives under the session's temporary root (``plugins/session.py``), removed when the session ends."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from filelock import FileLock


def session_root() -> Path:
    """This test session's shared temporary folder (one per ``pytest`` invocation, shared by its workers)."""
    session = os.environ.get("TRAINPILOT_TEST_SESSION") or f"pid{os.getpid()}"
    root = Path(tempfile.gettempdir()) / f"tp-session-{session}"
    root.mkdir(parents=True, exist_ok=True)
    return root


def shared_once(name: str, build: Callable[[Path], None]) -> Path:
    """``build(folder)`` once per session across workers; returns the folder. A build that raises leaves nothing
    behind, so the next asker tries again (and fails the same way, with its own traceback)."""
    root = session_root()
    folder, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            try:
                build(folder)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            done.touch()
    return folder
