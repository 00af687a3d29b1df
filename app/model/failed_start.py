"""A start that failed before the supervisor made its run folder still leaves one the runs list
shows: the config as submitted, the command's output as train.log, and a ``failed`` event
(``phase: "start"``, its ``message`` the CLI's last line) that ``trainer.rundir.runstate`` reads."""
from __future__ import annotations

import shutil
import signal
from pathlib import Path

from trainer.core.errors import EXIT_BAD_INPUT, EXIT_FAULT, EXIT_OOM
from trainer.rundir import events as ev
from trainer.rundir.records import Failed


def record(run_dir: str, config_path: str | None, code: int, stderr_tail: str, log_stem: Path | None) -> str | None:
    """Make ``run_dir`` a listed failed run when the CLI exited ``code`` before creating it. A folder
    that exists with anything in it is left alone. Returns None, or why nothing could be recorded
    (the folder cannot be written: the caller shows that with the CLI's own message; never raises)."""
    run = Path(run_dir)
    try:
        if run.exists() and (not run.is_dir() or any(run.iterdir())):
            return None  # the supervisor got that far and recorded it, or the folder is another run's: never touch
        run.mkdir(parents=True, exist_ok=True)
        if config_path and Path(config_path).is_file():
            shutil.copyfile(config_path, run / "config.yaml")
        (run / "train.log").write_text(_log_text(log_stem) or stderr_tail, encoding="utf-8")
        message = stderr_tail.strip().splitlines()[-1] if stderr_tail.strip() else f"exit code {code}"
        ev.EventWriter(run / ev.EVENTS_FILE).emit(Failed(message=message, exit_code=code, phase="start"))
    except OSError as exc:  # an unwritable runs folder is the usual reason the start failed in the first place
        return (f"the failed start could not be recorded in {run} ({exc.strerror or exc}); "
                f"choose a runs folder you can write to")
    return None


def _log_text(log_stem: Path | None) -> str:
    """The CLI child's captured stdout and stderr ('' when there are none)."""
    parts = []
    for suffix in (".stdout.log", ".stderr.log"):
        if log_stem is not None:
            try:
                parts.append(Path(f"{log_stem}{suffix}").read_text(encoding="utf-8", errors="replace"))
            except OSError:
                pass
    return "".join(parts)


EXIT_WORDS = {EXIT_FAULT: "an error", EXIT_BAD_INPUT: "bad input", EXIT_OOM: "out of memory after every recovery step"}


def ended_message(name: str, code: int, state, stderr_tail: str) -> str:
    """Why the command of run ``name`` ended with ``code`` (negative: killed by that signal), in words, for the popup:
    the run's own reason (``state``: its RunState — the failed event's message, or why its state differs from
    status.json) or the CLI's one-line error; never the progress lines the output ends with."""
    if code < 0:
        try:
            how = f"was killed (signal {-code}, {signal.Signals(-code).name})"
        except ValueError:
            how = f"was killed (signal {-code})"
    else:
        how = f"ended with exit code {code}" + (f" ({EXIT_WORDS[code]})" if code in EXIT_WORDS else "")
    said = cli_error(stderr_tail)
    why = getattr(state, "error", None) or getattr(state, "reason", None) or said
    text = f"{name} {how}" + (f": {why}" if why else ".")
    if getattr(state, "resumable", False):
        text += f"\n\nResume continues from checkpoint {state.checkpoint_step}."
    return text


def cli_error(stderr_tail: str) -> str | None:
    """The CLI's one-line error in its output (``trainpilot-cli: …``), the last one; None when it printed none."""
    lines = [x.strip() for x in stderr_tail.strip().splitlines() if x.strip()]
    return next((x for x in reversed(lines) if x.startswith("trainpilot-cli:")), None)


def start_failure_words(stderr_tail: str) -> str:
    """Why a start failed, for the window: the command's output as it is, unless it holds a traceback (a crash);
    then only the CLI's one-line error, or the traceback's last line (the exception), never its frames."""
    text = stderr_tail.strip()
    if "Traceback (most recent call last)" not in text:
        return text
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return cli_error(text) or lines[-1]
