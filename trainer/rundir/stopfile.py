"""The ``STOP`` file: a graceful stop request the worker checks after every step (then it saves a
checkpoint and exits 0). One home for its name, its writing and its reading: ``trainpilot-cli stop``,
Ctrl+C in the supervisor and the GUI's Stop all call ``request_stop``. Light (standard library)."""
from __future__ import annotations

import time
from pathlib import Path

STOP_FILE = "STOP"


def request_stop(run_dir: str | Path, source: str = "trainpilot-cli stop") -> Path:
    """Ask the worker of ``run_dir`` to save a checkpoint and exit 0; ``source`` says who asked (written
    into the file for people). Returns the file. Raises OSError when the run folder cannot be written."""
    path = Path(run_dir) / STOP_FILE
    path.write_text(f"{source} at {time.strftime('%Y-%m-%d %H:%M:%S')}\n", encoding="utf-8")
    return path


def stop_requested(run_dir: str | Path) -> bool:
    """True while a stop request waits in ``run_dir``."""
    return (Path(run_dir) / STOP_FILE).exists()


def clear_stop(run_dir: str | Path) -> None:
    """Remove a stop request (a resumed run must not stop at once)."""
    (Path(run_dir) / STOP_FILE).unlink(missing_ok=True)
