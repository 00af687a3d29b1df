"""One run per folder: a supervisor holds an exclusive lock on ``<run>/.supervisor.lock`` for as
long as it lives (the OS drops it when the process dies, so a crash never leaves a stale lock)."""
from __future__ import annotations

import os
import time
from pathlib import Path

from trainer.core.errors import UserError
from trainer.rundir.runstate import LOCK_FILE
_held: dict[str, int] = {}  # resolved run dir → open descriptor, kept until the process exits


def hold(run_dir: Path, wait_s: float = 10.0) -> None:
    """Take the run folder's lock for the rest of this process (no-op when this process holds it).
    Waits up to ``wait_s`` seconds (a supervisor that just wrote 'stopped' is still exiting), then
    raises UserError (exit 2) when another live process holds it."""
    key = str(Path(run_dir).resolve())
    path = Path(key) / LOCK_FILE
    if key in _held and path.exists():
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # a folder that became unwritable after the checks, or a resumed one that is
        raise UserError(f"output.runs_dir: cannot write in {run_dir} ({exc.strerror or exc}); choose a folder you "
                        f"can write to (--run-dir or output.runs_dir)", field="output.runs_dir",
                        path=str(run_dir)) from None
    deadline = time.monotonic() + wait_s
    while True:
        try:
            _lock(fd)
            break
        except OSError:
            if time.monotonic() < deadline:
                time.sleep(0.2)
                continue
        os.close(fd)
        other = path.read_text(encoding="utf-8", errors="replace").strip() or "another process"
        raise UserError(f"{run_dir} is already being run by {other}; one run per folder. Stop it first "
                        f"('trainpilot-cli stop {run_dir}') or choose another --run-dir", path=str(run_dir)) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()}".encode())
    _held[key] = fd


def release(run_dir: Path) -> None:
    """Give the run folder's lock back before this process ends (no-op when it does not hold it)."""
    fd = _held.pop(str(Path(run_dir).resolve()), None)
    if fd is not None:
        os.close(fd)  # closing the descriptor drops the OS lock


def _lock(fd: int) -> None:
    if os.name == "nt":
        import msvcrt

        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    else:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
