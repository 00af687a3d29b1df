"""A run's effective state: the one answer every reader asks (``trainpilot-cli status``, the runs list,
the dashboard, Try it, every button).

``status.json`` alone can lie: a supervisor killed with -9 cannot replace its "running". So the state
here is status.json *and* liveness (the supervisor's ``.supervisor.lock`` is held while it lives; the
OS drops the lock when it dies; pids are asked only for runs without a lock file), *and* what the
events say happened last. Light module (standard library; psutil, a core dependency, for pids).

| state      | when                                                                                   |
| ---------- | -------------------------------------------------------------------------------------- |
| `starting` | status.json says starting and the supervisor lives (or the folder is locked, no status) |
| `running`  | status.json says running and the supervisor lives, or only its worker still trains     |
| `stopping` | status.json says stopping (a STOP was seen) and the supervisor lives                    |
| `stopped`  | stopped on request; or a dead supervisor whose worker wrote `stopped` last               |
| `finished` | finished; or a dead supervisor whose worker wrote `finished` last                       |
| `failed`   | failed (the `failed` event's message is ``error``); a live state nobody is alive for    |
|            | (``crashed``: killed or crashed, ``reason`` says so); a GUI-recorded failed start        |
| `unknown`  | no status.json and no `failed` event: not (yet) a run                                   |

``resumable``: nothing of the run is alive, it did not finish, and a complete checkpoint exists.
``model``: what Try it / chat would load: ``final/`` when it holds a model, else the newest checkpoint.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from trainer.rundir.checkpoints import checkpoint_step, complete_checkpoints
from trainer.rundir.events import EVENTS_FILE, read_status

LIVE_STATES = ("starting", "running", "stopping")
DONE_STATES = ("stopped", "finished", "failed")
LOCK_FILE = ".supervisor.lock"
TERMINAL_EVENTS = ("finished", "stopped", "failed")
TAIL_BYTES = 1 << 20  # the end of events.jsonl read for the last terminal event (bytes)


@dataclass(frozen=True)
class TrainedModel:
    """A loadable trained model of a run: ``path`` and ``label`` ('final' or 'checkpoint-<step>')."""

    path: Path
    label: str
    step: int | None  # the checkpoint's optimizer step; None for final/


@dataclass(frozen=True)
class RunState:
    """Everything a reader needs to show a run or enable a button (see the module table)."""

    run_dir: Path
    state: str                      # the effective state (module table)
    recorded_state: str | None      # what status.json says (None: no status.json)
    alive: bool                     # the supervisor or its worker is alive
    pid: int | None                 # the live supervisor's pid
    worker_pid: int | None          # the live worker's pid
    crashed: bool                   # status.json said live, nothing of the run is alive, no last word
    reason: str | None              # why the effective state differs from status.json (a sentence)
    step: int | None                # newest optimizer step known (status.json or step events)
    max_steps: int | None
    attempt: int | None
    updated: float | None           # status.json's last update (Unix seconds)
    error: str | None               # the last `failed` event's message (of the newest attempt)
    error_phase: str | None         # 'start' for a start that failed before the supervisor ran
    checkpoint: Path | None         # the newest complete checkpoint
    model: TrainedModel | None      # what Try it / chat loads
    resumable: bool

    @property
    def live(self) -> bool:
        """True while the run is starting, running or stopping (effectively, not just on paper)."""
        return self.state in LIVE_STATES

    @property
    def checkpoint_step(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        return checkpoint_step(self.checkpoint) if self.checkpoint else None

    def to_dict(self) -> dict:
        """JSON-ready: paths as strings, the model as ``{"path", "label", "step"}``."""
        out = {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items() if k != "model"}
        out["model"] = ({"path": str(self.model.path), "label": self.model.label, "step": self.model.step}
                        if self.model else None)
        out["checkpoint_step"] = self.checkpoint_step
        return out


def read_run_state(run_dir: str | Path) -> RunState:
    """The effective state of ``run_dir`` (cheap: status.json, a lock probe, the events' last MiB)."""
    run = Path(run_dir)
    status = read_status(run) or {}
    recorded = status.get("state") if isinstance(status.get("state"), str) else None
    sup_pid, worker_pid = _live_pids(run, status)
    events = _tail_events(run / EVENTS_FILE)
    last = _last_word(events)
    state, crashed, reason = _decide(recorded, sup_pid is not None, worker_pid is not None, last, run)
    failed = last if last and last.get("type") == "failed" else None
    done = complete_checkpoints(run / "checkpoints")
    newest = done[-1] if done else None
    alive = sup_pid is not None or worker_pid is not None
    step = _max_int(status.get("step"), _last_step(events))
    return RunState(
        run_dir=run, state=state, recorded_state=recorded, alive=alive, pid=sup_pid, worker_pid=worker_pid,
        crashed=crashed, reason=reason, step=step, max_steps=_int(status.get("max_steps")),
        attempt=_int(status.get("attempt")), updated=_float(status.get("updated")),
        error=_text(failed.get("message") or failed.get("error")) if failed else None,
        error_phase=_text(failed.get("phase")) if failed else None,
        checkpoint=newest, model=trained_model(run, done),
        resumable=not alive and state != "finished" and state != "unknown" and newest is not None)


def _decide(recorded: str | None, sup_alive: bool, worker_alive: bool, last: dict | None,
            run: Path) -> tuple[str, bool, str | None]:
    """``(state, crashed, reason)`` from status.json's state, liveness and the last terminal event."""
    if recorded in LIVE_STATES:
        if sup_alive:
            return recorded, False, None
        if worker_alive:
            return (recorded if recorded != "starting" else "running", False,
                    "the supervisor is gone but its worker still trains; stop it with "
                    f"'trainpilot-cli stop {run}', then resume")
        if last is not None and last.get("type") in TERMINAL_EVENTS:
            return last["type"], False, f"the supervisor is gone; the worker's last word was '{last['type']}'"
        return "failed", True, (f"the supervisor is gone (killed or crashed) while '{recorded}'; "
                                f"resume with: trainpilot-cli resume {run}")
    if recorded in DONE_STATES:
        return recorded, False, None
    if last is not None and last.get("type") == "failed":
        return "failed", False, None  # a start that failed before status.json existed
    if sup_alive:
        return "starting", False, None
    return "unknown", False, None


def _live_pids(run: Path, status: dict) -> tuple[int | None, int | None]:
    """``(supervisor pid, worker pid)``, each None unless that process is alive.

    The lock decides for the supervisor when the folder has one (pids are reused; locks are not).
    Pids are asked only while status.json says the run is live: an old run's pids may be reused."""
    pid, worker = _int(status.get("pid")), _int(status.get("worker_pid"))
    live_on_paper = status.get("state") in LIVE_STATES
    lock = run / LOCK_FILE
    if lock.exists():
        sup = (_lock_owner(lock) or pid) if lock_held(lock) else None
    else:
        sup = pid if live_on_paper and pid_alive(pid) else None
    return sup, (worker if live_on_paper and pid_alive(worker) else None)


def lock_held(path: Path) -> bool:
    """True when some process holds the exclusive lock on ``path`` (a live supervisor)."""
    try:
        fd = os.open(path, os.O_RDONLY if os.name != "nt" else os.O_RDWR)
    except OSError:
        return False
    try:
        return not _try_lock(fd)
    finally:
        os.close(fd)


def _try_lock(fd: int) -> bool:
    """Take and release the lock at once; False when another process holds it."""
    try:
        if os.name == "nt":
            import msvcrt

            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        else:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError:
        return False
    return True


def _lock_owner(lock: Path) -> int | None:
    """The pid the lock file names ('pid 1234'), or None."""
    try:
        words = lock.read_text(encoding="utf-8", errors="replace").split()
    except OSError:
        return None
    return int(words[1]) if len(words) == 2 and words[0] == "pid" and words[1].isdigit() else None


def pid_alive(pid) -> bool:
    """True when ``pid`` is a running (non-zombie) process."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def trained_model(run_dir: str | Path, done: list[Path] | None = None) -> TrainedModel | None:
    """What Try it / chat loads by default: ``final/`` with a model in it, else the newest complete
    checkpoint, else None."""
    run = Path(run_dir)
    final = run / "final"
    if (final / "config.json").is_file() or (final / "adapter_config.json").is_file():
        return TrainedModel(final, "final", None)
    done = complete_checkpoints(run / "checkpoints") if done is None else done
    return TrainedModel(done[-1], done[-1].name, checkpoint_step(done[-1])) if done else None


def _tail_events(path: Path, max_bytes: int = TAIL_BYTES) -> list[dict]:
    """The newest events of ``path`` that the state needs, oldest first: parsed from the end of its last
    ``max_bytes`` back to the newest attempt's terminal (or ``run_started``) event and the newest step event.
    Parsing only those keeps this cheap for a day-long run (the GUI asks every second: parsing the whole MiB
    held the GIL long enough to stall the window). A cut first line and half-written lines are skipped."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return []
    if size > max_bytes:
        data = data[data.find(b"\n") + 1:]
    out, have_word, have_step = [], False, False
    for raw in reversed(data.split(b"\n")):
        if not raw.strip():
            continue
        try:
            event = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        out.append(event)
        kind = event.get("type")
        have_word = have_word or kind in TERMINAL_EVENTS or kind == "run_started"
        have_step = have_step or kind == "step"
        if have_word and have_step:
            break
    return out[::-1]


def _last_word(events: list[dict]) -> dict | None:
    """The newest attempt's terminal event (finished/stopped/failed), or None while it has none."""
    for e in reversed(events):
        if e.get("type") in TERMINAL_EVENTS:
            return e
        if e.get("type") == "run_started":
            return None
    return None


def _last_step(events: list[dict]) -> int | None:
    return next((_int(e.get("step")) for e in reversed(events) if e.get("type") == "step"), None)


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _float(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _text(v) -> str | None:
    return v if isinstance(v, str) and v else None


def _max_int(*values) -> int | None:
    nums = [v for v in map(_int, values) if v is not None]
    return max(nums) if nums else None

