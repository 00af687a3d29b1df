"""Everything known about one run directory, read incrementally (no Qt here).

Reading is split in two so the GUI thread never parses JSON: ``RunReader.read()`` (any thread)
tails ``events.jsonl`` and ``telemetry.jsonl`` in bounded chunks with the trainer's tolerant
``JsonlTail`` and turns them into numpy columns (a ``Batch``); ``RunData.apply(batch)`` (the GUI
thread) appends those columns to the series the dashboard binds to, which costs microseconds.
``RunData.poll()`` does both at once for scripts and tests. Telemetry lines are
``MachineSnapshot.to_dict()`` objects.

The run's state is ``trainer.rundir.runstate``'s answer (the one ``trainpilot-cli status``, the runs list
and every button use), asked on the reader thread: when status.json or the events changed, and at
least once a second for liveness (a kill -9 changes no file).

Gaps are drawn as gaps: a NaN point goes between telemetry samples more than ``GAP_S`` apart (the
supervisor samples at 1 Hz while alive; ``app.model.telemetry``, the one home of snapshot → series) and
before the first step of each resumed attempt.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from app.model.grpo_metrics import GrpoSeries, grpo_columns, is_grpo_step
from app.model.series import Series
from app.model.telemetry import GAP_S, GPU_FIELDS, Columns, TelemetryColumns  # noqa: F401 (GAP_S re-exported)
from trainer.rundir import events as ev
from trainer.rundir.checkpoints import checkpoint_step
from trainer.rundir.runstate import RunState, read_run_state

LOG_TAIL_BYTES = 64 * 1024
CHUNK_BYTES = 1 << 20  # per read: ~1,000 telemetry lines, a few ms of parsing (off the GUI thread)
STATE_EVERY_S = 1.0  # liveness is asked at least this often while a run is shown (seconds)


@dataclass
class Batch:
    """New data read from a run directory, as columns (Unix seconds, steps, raw units)."""

    step_x: list = field(default_factory=list)        # step numbers
    loss: list = field(default_factory=list)
    lr: list = field(default_factory=list)
    grad_norm: list = field(default_factory=list)      # the gradient norm before clipping (NaN: not logged)
    tps_t: list = field(default_factory=list)          # event time of each step (a NaN tps: resume gap)
    tps: list = field(default_factory=list)
    reward_x: list = field(default_factory=list)      # steps of preference objectives' reward metrics
    reward_accuracy: list = field(default_factory=list)
    reward_margin: list = field(default_factory=list)
    grpo_steps: list = field(default_factory=list)    # GRPO step events, turned into ``grpo`` columns after reading
    grpo: dict | None = None                           # app.model.grpo_metrics.grpo_columns of those
    telemetry: Columns | None = None                   # new telemetry samples as columns
    events: list = field(default_factory=list)         # every non-step event, in order
    last_step: dict | None = None
    throttle_periods: list | None = None               # full list when it changed
    status: dict | None = None
    run_state: RunState | None = None                  # the effective state, when asked this read
    plan: dict | None = None
    resumed_at: float | None = None                    # a resumed attempt began at this step: later points go
    more: bool = False                                 # a backlog remains: read again soon

    def empty(self) -> bool:
        """True when nothing new was read (status aside)."""
        return not (self.step_x or self.events or self.telemetry is not None)


class RunReader:
    """The reading half (thread-safe to use from ONE worker thread at a time; no Qt, no GUI state)."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self._events = ev.JsonlTail(run_dir / ev.EVENTS_FILE)
        self._tele = ev.JsonlTail(run_dir / ev.TELEMETRY_FILE)
        self._attempts = 0
        self._break_pending = False
        self._last_step_t: float | None = None
        self._columns = TelemetryColumns()
        self._plan_seen = False
        self._state_asked = 0.0  # time.monotonic() of the last runstate read
        self._state_status: dict | None = None

    def read(self, max_bytes: int = CHUNK_BYTES) -> Batch:
        """At most ``max_bytes`` of each file, parsed into a Batch (``more`` when a backlog remains)."""
        b = Batch()
        for e in self._events.poll(max_bytes):
            if isinstance(e.get("type"), str):
                self._event(b, e)
        if b.grpo_steps:
            b.grpo, b.grpo_steps = grpo_columns(b.grpo_steps), []
        self._telemetry(b, self._tele.poll(max_bytes))
        b.status = ev.read_status(self.run_dir)
        if not self._plan_seen and (b.events or b.step_x):
            b.plan = ev.read_json(self.run_dir / "plan.json")
            self._plan_seen = b.plan is not None
        b.more = self._backlog(self._events) or self._backlog(self._tele)
        if not b.more:
            b.run_state = self._ask_state(b)
        return b

    def _ask_state(self, b: Batch) -> RunState | None:
        """runstate's answer when something it reads changed or a second has passed, else None."""
        now = time.monotonic()
        if b.status == self._state_status and not b.events and not b.step_x and now - self._state_asked < STATE_EVERY_S:
            return None
        self._state_asked, self._state_status = now, b.status
        return read_run_state(self.run_dir)

    @staticmethod
    def _backlog(tail: ev.JsonlTail) -> bool:
        try:
            return os.stat(tail.path).st_size - tail.offset > 1024
        except OSError:
            return False

    def _event(self, b: Batch, e: dict) -> None:
        kind = e["type"]
        if kind == "step":
            step = _num(e.get("step"))
            if step is None:
                return
            b.last_step = e
            t = _num(e.get("time"))
            if t is not None:
                if self._break_pending and self._last_step_t is not None:
                    b.tps_t.append((self._last_step_t + t) / 2)
                    b.tps.append(np.nan)
                self._break_pending = False
                self._last_step_t = t
                b.tps_t.append(t)
                b.tps.append(_nan(e.get("tokens_per_second")))
            b.step_x.append(step)
            b.loss.append(_nan(e.get("loss")))
            b.lr.append(_nan(e.get("learning_rate")))
            b.grad_norm.append(_nan(e.get("grad_norm")))
            if "rewards_margin" in e:  # preference objectives (docs/preference.md)
                b.reward_x.append(step)
                b.reward_accuracy.append(_nan(e.get("reward_accuracy")))
                b.reward_margin.append(_nan(e.get("rewards_margin")))
            if is_grpo_step(e):  # GRPO's rewards (app.model.grpo_metrics)
                b.grpo_steps.append(e)
            return
        if kind == "run_started":
            self._attempts += 1
            self._break_pending = self._attempts > 1  # a resumed attempt: a gap, not a straight line
            if self._attempts > 1:
                _resumed(b, resume_step(e))
        b.events.append(e)

    def _telemetry(self, b: Batch, snaps: list[dict]) -> None:
        b.telemetry = self._columns.parse(snaps)
        if b.telemetry is not None and b.telemetry.throttle_changed:
            b.throttle_periods = [list(p) for p in self._columns.throttle]


def resume_step(e: dict) -> int:
    """The step a later attempt's ``run_started`` continues from: its checkpoint's, 0 when it starts over."""
    return max(checkpoint_step(e["resume_from"]), 0) if isinstance(e.get("resume_from"), str) else 0


def _resumed(b: Batch, step: int) -> None:
    """A resumed attempt redoes the steps after ``step``: the step-indexed points of earlier attempts beyond it go
    (those of this batch here, those already shown in ``RunData.apply``), so the charts draw one lineage."""
    b.resumed_at = step if b.resumed_at is None else min(b.resumed_at, step)
    keep = [i for i, x in enumerate(b.step_x) if x <= step]
    b.step_x, b.loss, b.lr, b.grad_norm = ([col[i] for i in keep] for col in (b.step_x, b.loss, b.lr, b.grad_norm))
    keep = [i for i, x in enumerate(b.reward_x) if x <= step]
    b.reward_x, b.reward_accuracy, b.reward_margin = ([col[i] for i in keep]
                                                      for col in (b.reward_x, b.reward_accuracy, b.reward_margin))
    b.grpo_steps = [e for e in b.grpo_steps if _num(e.get("step")) <= step]


class RunData:
    """Series, status and events of one run directory, fed by ``apply(batch)`` (the GUI thread)."""

    def __init__(self, run_dir: str | Path | None):
        # run_dir None: the machine itself, fed only by add_snapshot() from the GUI's probe.
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.reader = RunReader(self.run_dir) if self.run_dir is not None else None
        # step-indexed
        self.loss, self.lr, self.grad_norm = Series(), Series(), Series()
        self.reward_accuracy, self.reward_margin = Series(), Series()  # preference objectives (docs/preference.md)
        self.grpo = GrpoSeries()  # GRPO: rewards per function and in total, no-signal share, lengths, KL
        self.objective: str | None = None  # run_started's objective (None: an older run, or not started yet)
        self.world_size = 1  # run_started's ranks (data-parallel GPUs × machines): they share the effective batch
        # time-indexed (Unix seconds)
        self.tokens_per_s = Series()
        self.vram_used, self.vram_total = Series(), Series()
        self.temperature, self.power, self.power_limit, self.utilization = Series(), Series(), Series(), Series()
        self.host_ram_available = Series()
        self.gpu_series = {"vram_used": self.vram_used, "vram_total": self.vram_total, "temp": self.temperature,
                           "power": self.power, "power_limit": self.power_limit, "util": self.utilization}
        assert set(self.gpu_series) == set(GPU_FIELDS)
        self.throttle_periods: list[list[float]] = []  # [start, end] Unix seconds
        # every card's series (NVML index → {GPU_FIELDS name → Series}) and names: a curve per card when several
        self.cards: dict[int, dict[str, Series]] = {}
        self.card_names: dict[int, str] = {}
        self.last_step: dict | None = None
        self.last_snapshot: dict | None = None
        self.notices: list[dict] = []  # warning / oom / retry / checkpoint_saved / stopped / finished events
        self.started: float | None = None
        self.status: dict | None = None
        self.run_state: RunState | None = None  # runstate's answer; None until first read (or the machine)
        self.plan: dict | None = None
        self.loaded = False  # True once the backlog present at opening has been read
        self.version = 0
        self._machine = TelemetryColumns()  # the GUI's own probe samples (the machine view)

    # -- reading --------------------------------------------------------------------------------
    def poll(self) -> bool:
        """Read everything new now, in this thread (scripts and tests; the GUI uses the Monitor's
        reader thread). Returns True when anything changed."""
        if self.reader is None:
            return False
        changed = False
        while True:
            batch = self.reader.read()
            changed = self.apply(batch) or changed
            if not batch.more:
                return changed

    def apply(self, b: Batch) -> bool:
        """Append a Batch read by ``self.reader`` (cheap: numpy copies). True when anything changed."""
        status_changed = b.status != self.status or (b.run_state is not None and b.run_state != self.run_state)
        self.status = b.status
        if b.run_state is not None:
            self.run_state = b.run_state
        if b.plan is not None:
            self.plan = b.plan
        if b.resumed_at is not None:
            for series in (self.loss, self.lr, self.grad_norm, self.reward_accuracy, self.reward_margin):
                series.drop_after(b.resumed_at)
            self.grpo.drop_after(b.resumed_at)
        for e in b.events:
            self._on_event(e)
        if b.step_x:
            self.loss.extend(b.step_x, b.loss)
            self.lr.extend(b.step_x, b.lr)
            self.grad_norm.extend(b.step_x, b.grad_norm)
            self.last_step = b.last_step
        if b.reward_x:
            self.reward_accuracy.extend(b.reward_x, b.reward_accuracy)
            self.reward_margin.extend(b.reward_x, b.reward_margin)
        if b.grpo is not None:
            self.grpo.extend(b.grpo)
        if b.tps_t:
            self.tokens_per_s.extend(b.tps_t, b.tps)
        if b.telemetry is not None:
            self._append_telemetry(b.telemetry)
        if b.throttle_periods is not None:
            self.throttle_periods = b.throttle_periods
        if not b.more:
            self.loaded = True
        if status_changed or not b.empty():
            self.version += 1
            return True
        return False

    def _on_event(self, e: dict) -> None:
        kind, t = e["type"], _num(e.get("time"))
        if kind == "run_started":
            self.started = self.started or t
            if isinstance(e.get("objective"), str):
                self.objective = e["objective"]
            if isinstance(e.get("world_size"), int) and e["world_size"] > 0:
                self.world_size = e["world_size"]
            self.grpo.started(e)
        elif kind == "eval":
            self.grpo.evaluated(e)  # GRPO's validation reward (other runs' evals carry a loss, not a reward)
        elif kind == "plan" and isinstance(e.get("plan"), dict):
            self.plan = e["plan"]
        if kind != "plan":
            self.notices.append(e)

    def _append_telemetry(self, cols: Columns) -> None:
        self.host_ram_available.extend(cols.t, cols.ram)
        self.last_snapshot = cols.last_snapshot
        if cols.gpu_t is not None:
            for name, series in self.gpu_series.items():
                series.extend(cols.gpu_t, cols.gpu[name])
        for index, (t, values) in cols.cards.items():
            card = self.cards.setdefault(index, {name: Series() for name in GPU_FIELDS})
            for name, series in card.items():
                series.extend(t, values[name])
        self.card_names.update(cols.card_names)

    def add_snapshot(self, snap: dict) -> None:
        """Append one ``MachineSnapshot.to_dict()`` from the GUI's own probe (the machine view)."""
        cols = self._machine.parse([snap])
        if cols is None:
            return
        self._append_telemetry(cols)
        if cols.throttle_changed:
            self.throttle_periods = [list(p) for p in self._machine.throttle]

    # -- derived --------------------------------------------------------------------------------
    @property
    def state(self) -> str:
        """The run's effective state (runstate: status.json and liveness); 'unknown' before the first
        read; for the machine view, 'machine (no run selected)'."""
        if self.run_dir is None:
            return "machine (no run selected)"
        return self.run_state.state if self.run_state is not None else "unknown"

    def is_alive(self) -> bool:
        """True while a process of the run (its supervisor or its worker) is alive."""
        return self.run_state is not None and self.run_state.alive

    def is_live(self) -> bool:
        """True while the run is effectively starting, running or stopping (Stop means something)."""
        return self.run_state is not None and self.run_state.live

    def checkpoint_words(self) -> str:
        """What Resume can do, as a run that is not live says it: "Resume continues from checkpoint 16"; a checkpoint
        the run folder already holds while the run's processes are still exiting (seconds after a Stop that saved
        it) is named as saved, never as missing; "no complete checkpoint to resume from" only when there is none."""
        rs = self.run_state
        if rs is not None and rs.resumable:
            return f"Resume continues from checkpoint {rs.checkpoint_step}"
        if rs is not None and rs.checkpoint is not None:
            return f"checkpoint {rs.checkpoint_step} saved; Resume once the run has exited"
        return "no complete checkpoint to resume from"

    def resumable(self) -> bool:
        """True when Resume can continue the run: nothing of it alive, not finished, a checkpoint."""
        return self.run_state is not None and self.run_state.resumable

    def error_text(self) -> str | None:
        """Why the run failed (the failed event's message, or why a killed run reads failed), else None."""
        rs = self.run_state
        if rs is None or rs.state != "failed":
            return None
        if rs.error:
            return rs.error
        if rs.crashed:  # the GUI's own words: what Resume can do is said beside it, only when it can
            return f"its processes are gone (killed or crashed) while it was {rs.recorded_state}"
        return rs.reason or "the worker stopped with an error"

    def final_model(self) -> Path | None:
        """``<run>/final`` when the run finished and wrote its model there, else None."""
        rs = self.run_state
        if rs is None or rs.state != "finished" or rs.model is None or rs.model.label != "final":
            return None
        return rs.model.path

    def on_cpu(self) -> bool:
        """True for a run planned for the CPU (its GPU samples, if any, are not the run's)."""
        return (self.plan or {}).get("device") == "cpu"

    def on_gpu(self) -> bool:
        """True for the machine view and a run planned for a GPU (a run read whole without a plan: an older one).
        False for a CPU run, and for a run whose plan is not read yet: a CPU run showed "Warnings (4)" about the GPU,
        then "No warnings", as its folder was read."""
        if self.run_dir is None:
            return True
        return not self.on_cpu() and (self.plan is not None or self.loaded)

    def predicted_peak_bytes(self) -> float | None:
        """The planner's predicted peak VRAM (bytes), when plan.json has one for a GPU run."""
        if self.on_cpu():
            return None  # a CPU plan's peak is host RAM, not VRAM
        return _num((self.plan or {}).get("predicted_peak_bytes"))

    def effective_batch(self) -> int | None:
        """micro × accumulation from the last step × the ranks (run_started's ``world_size``: each rank trains its
        own micro-batches), samples per optimizer step."""
        s = self.last_step or {}
        mb, ga = s.get("micro_batch_size"), s.get("gradient_accumulation_steps")
        return int(mb) * int(ga) * self.world_size if isinstance(mb, int) and isinstance(ga, int) else None

    def log_tail(self, lines: int = 40) -> list[str]:
        """The last ``lines`` lines of train.log (reads at most 64 KiB from the end; a partial first
        line of that window is dropped, never shown cut)."""
        if self.run_dir is None:
            return []
        path = self.run_dir / "train.log"
        try:
            with open(path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                start = max(0, size - LOG_TAIL_BYTES)
                fh.seek(start)
                data = fh.read()
        except OSError:
            return []
        text = data.decode("utf-8", errors="replace").replace("\r", "\n")
        kept = text.splitlines()
        if start > 0 and kept:
            kept = kept[1:]
        return [ln for ln in kept if ln.strip()][-lines:]


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _nan(v) -> float:
    n = _num(v)
    return np.nan if n is None else n
