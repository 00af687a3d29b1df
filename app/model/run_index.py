"""The runs index: every run folder with its state, start time and progress (plain Python, no Qt).

A row's state is ``trainer.rundir.runstate``'s answer, the one ``trainpilot-cli status`` gives: a run
whose supervisor was killed reads "failed" here too, not the "running" its stale status.json says.
Asking costs a parse of the events' tail, so a run that has ended on paper (stopped, finished, failed)
is asked again only when one of its files changed; a run that is live on paper is asked every scan
(a kill -9 changes no file)."""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from trainer.rundir import events as ev
from trainer.rundir.runstate import DONE_STATES, RunState, read_run_state


@dataclass(frozen=True)
class RunSummary:
    """One row: folder, effective state, start time (Unix seconds or None), step and max_steps,
    whether Resume can continue it, and why the state differs from status.json (or None)."""

    path: str
    state: str
    started: float | None
    step: int | None
    max_steps: int | None
    resumable: bool = False
    reason: str | None = None

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


def started_time(path: Path) -> float | None:
    """When the run started (Unix seconds): its first event's time, else config.yaml's mtime."""
    try:
        with open(path / ev.EVENTS_FILE, "rb") as fh:
            started = json.loads(fh.readline()).get("time")
        if isinstance(started, (int, float)):
            return float(started)
    except (OSError, ValueError, AttributeError):
        pass
    try:
        return (path / "config.yaml").stat().st_mtime
    except OSError:
        return None


def summary_of(path: Path, rs: RunState) -> RunSummary:
    """The row of ``path`` for its RunState."""
    return RunSummary(str(path), rs.state, started_time(path), rs.step, rs.max_steps, rs.resumable, rs.reason)


class _Cache:
    """RunStates of runs that ended on paper, keyed by their files' sizes and times (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._rows: dict[str, tuple[tuple, RunSummary]] = {}

    def get(self, path: Path) -> RunSummary:
        key = _files_key(path)
        with self._lock:
            hit = self._rows.get(str(path))
        if hit is not None and hit[0] == key:
            return hit[1]
        rs = read_run_state(path)
        row = summary_of(path, rs)
        if rs.recorded_state in DONE_STATES:
            with self._lock:
                self._rows[str(path)] = (key, row)
        return row


def _files_key(path: Path) -> tuple:
    """What changes when anything runstate reads changes, for a run no process writes into."""
    out = []
    for name in (ev.STATUS_FILE, ev.EVENTS_FILE, "checkpoints", "final"):
        try:
            st = os.stat(path / name)
            out.append((st.st_size, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


_CACHE = _Cache()


def summarize(path: Path) -> RunSummary:
    """One run's row (its state from runstate; cached while nothing in the folder changes)."""
    return _CACHE.get(path)


def scan(runs_dir: Path, extra: list[str]) -> list[RunSummary]:
    """Every run under ``runs_dir`` plus the extra folders, newest first. Reads files: call it off the
    GUI thread."""
    paths = {p.resolve() for p in runs_dir.iterdir() if is_run_dir(p)} if runs_dir.is_dir() else set()
    paths |= {Path(p).resolve() for p in extra if is_run_dir(Path(p))}
    rows = [summarize(p) for p in paths]
    return sorted(rows, key=lambda r: r.started or 0, reverse=True)
