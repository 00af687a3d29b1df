"""A start that failed before the supervisor made its run folder still leaves one the runs list
shows: the config as submitted, the command's output as train.log, and a ``failed`` event."""
from __future__ import annotations

import shutil
from pathlib import Path

from trainer.rundir import events as ev
from trainer.rundir.records import Failed


def record(run_dir: str, config_path: str | None, code: int, stderr_tail: str, log_stem: Path | None) -> bool:
    """Make ``run_dir`` a listed failed run when the CLI exited ``code`` before creating it. A folder
    that exists with anything in it is left alone. Returns False when the folder cannot be written (the
    start failed for that reason, most likely): the caller still shows the error, never an exception."""
    run = Path(run_dir)
    try:
        if run.exists() and (not run.is_dir() or any(run.iterdir())):
            return False  # the supervisor got that far and recorded it, or the folder is another run's: never touch
        _write(run, config_path, code, stderr_tail, log_stem)
    except OSError:
        return False
    return True


def _write(run: Path, config_path: str | None, code: int, stderr_tail: str, log_stem: Path | None) -> None:
    run.mkdir(parents=True, exist_ok=True)
    if config_path and Path(config_path).is_file():
        shutil.copyfile(config_path, run / "config.yaml")
    parts = []
    for suffix in (".stdout.log", ".stderr.log"):
        if log_stem is not None:
            try:
                parts.append(Path(f"{log_stem}{suffix}").read_text(encoding="utf-8", errors="replace"))
            except OSError:
                pass
    (run / "train.log").write_text("".join(parts) or stderr_tail, encoding="utf-8")
    message = stderr_tail.strip().splitlines()[-1] if stderr_tail.strip() else f"exit code {code}"
    ev.EventWriter(run / ev.EVENTS_FILE).emit(Failed(message=message, exit_code=code, extra={"phase": "start"}))
