"""The runs index: every run folder with its state, start time and progress (plain Python, no Qt)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from trainer.rundir import events as ev


@dataclass(frozen=True)
class RunSummary:
    """One row: folder, state, start time (Unix seconds or None), step and max_steps."""

    path: str
    state: str
    started: float | None
    step: int | None
    max_steps: int | None

    @property
    def progress(self) -> str:
        """'12 / 40 (30%)' or ''."""
        if not self.max_steps:
            return "" if self.step is None else str(self.step)
        step = self.step or 0
        return f"{step} / {self.max_steps} ({step / self.max_steps:.0%})"


def is_run_dir(path: Path) -> bool:
    """True for a folder that looks like a run directory."""
    return path.is_dir() and any((path / f).exists() for f in (ev.STATUS_FILE, ev.EVENTS_FILE, "config.yaml"))


def summarize(path: Path) -> RunSummary:
    """Read status.json and the first event line (cheap: never the whole event file)."""
    status = ev.read_status(path) or {}
    started, first_type = None, None
    try:
        with open(path / ev.EVENTS_FILE, "rb") as fh:
            first = json.loads(fh.readline())
            started, first_type = first.get("time"), first.get("type")
    except (OSError, ValueError, AttributeError):
        pass
    if started is None:
        try:
            started = (path / "config.yaml").stat().st_mtime
        except OSError:
            pass
    state = status.get("state") or ("failed" if first_type == "failed" else "new")  # a start that failed early
    return RunSummary(str(path), state, started, status.get("step"), status.get("max_steps"))


def scan(runs_dir: Path, extra: list[str]) -> list[RunSummary]:
    """Every run under ``runs_dir`` plus the extra folders, newest first."""
    paths = {p.resolve() for p in runs_dir.iterdir() if is_run_dir(p)} if runs_dir.is_dir() else set()
    paths |= {Path(p).resolve() for p in extra if is_run_dir(Path(p))}
    rows = [summarize(p) for p in paths]
    return sorted(rows, key=lambda r: r.started or 0, reverse=True)
