"""A start that failed before the supervisor made its run folder still leaves one the runs list
shows: the config as submitted, the command's output as train.log, and a ``failed`` event."""
from __future__ import annotations

import shutil
from pathlib import Path

from trainer.rundir import events as ev


def record(run_dir: str, config_path: str | None, code: int, stderr_tail: str, log_stem: Path | None) -> None:
    """Make ``run_dir`` a listed failed run when the CLI exited ``code`` before creating it. A folder
    that exists with anything in it is left alone."""
    run = Path(run_dir)
    if run.exists() and (not run.is_dir() or any(run.iterdir())):
        return  # the supervisor got that far and recorded it, or the folder is another run's: never touch
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
    ev.EventWriter(run / ev.EVENTS_FILE).write("failed", error=message, exit_code=code, phase="start")
