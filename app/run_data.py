"""Everything known about one run directory, read incrementally (no Qt here).

``RunData.poll()`` tails ``events.jsonl`` and ``telemetry.jsonl`` with the trainer's tolerant
``JsonlTail`` (a half-written last line waits for the next poll) and appends to numpy series the
dashboard binds to. Telemetry lines are ``MachineSnapshot.to_dict()`` objects.
"""
from __future__ import annotations

import os
from pathlib import Path

from app.facts import first_gpu, is_throttled, pid_alive  # noqa: F401 (pid_alive re-exported)
from app.series import Series
from trainer.rundir import events as ev

LOG_TAIL_BYTES = 64 * 1024


class RunData:
    """Series, status and events of one run directory; ``poll()`` reads what is new."""

    def __init__(self, run_dir: str | Path | None):
        # run_dir None: the machine itself, fed only by add_snapshot() from the GUI's probe.
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self._events_tail = ev.JsonlTail(self.run_dir / ev.EVENTS_FILE) if run_dir is not None else None
        self._tele_tail = ev.JsonlTail(self.run_dir / ev.TELEMETRY_FILE) if run_dir is not None else None
        # step-indexed
        self.loss, self.lr = Series(), Series()
        self.reward_accuracy, self.reward_margin = Series(), Series()  # preference objectives (docs/preference.md)
        # time-indexed (Unix seconds)
        self.tokens_per_s = Series()
        self.vram_used, self.vram_total = Series(), Series()
        self.temperature, self.power, self.power_limit, self.utilization = Series(), Series(), Series(), Series()
        self.host_ram_available = Series()
        self.throttle_periods: list[list[float]] = []  # [start, end] Unix seconds
        self.last_step: dict | None = None
        self.last_snapshot: dict | None = None
        self.failure: dict | None = None
        self.notices: list[dict] = []  # warning / oom / retry / checkpoint_saved / stopped / finished events
        self.started: float | None = None
        self.status: dict | None = None
        self.plan: dict | None = ev.read_json(self.run_dir / "plan.json") if run_dir is not None else None
        self.version = 0

    # -- reading --------------------------------------------------------------------------------
    def poll(self) -> bool:
        """Read new events, telemetry and status. Returns True when anything changed."""
        if self.run_dir is None:
            return False
        changed = False
        new_events = self._events_tail.poll()
        for e in new_events:
            if isinstance(e.get("type"), str):
                self._on_event(e)
        new_tele = self._tele_tail.poll()
        for snap in new_tele:
            self.add_snapshot(snap)
        status = ev.read_status(self.run_dir)
        if status != self.status:
            self.status, changed = status, True
        if self.plan is None and new_events:
            self.plan = ev.read_json(self.run_dir / "plan.json")
        if new_events or new_tele or changed:
            self.version += 1
            return True
        return False

    def _on_event(self, e: dict) -> None:
        kind, t = e["type"], _num(e.get("time"))
        if kind == "run_started":
            self.started = self.started or t
            self.failure = None  # a resumed attempt supersedes an earlier crash
        elif kind == "step":
            self._on_step(e, t)
        elif kind == "plan" and isinstance(e.get("plan"), dict):
            self.plan = e["plan"]
        elif kind == "failed":
            self.failure = e
        if kind not in ("step", "plan"):
            self.notices.append(e)

    def _on_step(self, e: dict, t: float | None) -> None:
        step = _num(e.get("step"))
        if step is None:
            return
        self.last_step = e
        self.loss.append(step, _num(e.get("loss")))
        self.lr.append(step, _num(e.get("learning_rate")))
        if "rewards_margin" in e:
            self.reward_accuracy.append(step, _num(e.get("reward_accuracy")))
            self.reward_margin.append(step, _num(e.get("rewards_margin")))
        if t is not None:
            self.tokens_per_s.append(t, _num(e.get("tokens_per_second")))

    def add_snapshot(self, snap: dict) -> None:
        """Append one ``MachineSnapshot.to_dict()`` (from telemetry.jsonl or the GUI's own probe)."""
        t = _num(snap.get("time"))
        if t is None:
            return
        self.last_snapshot = snap
        host = snap.get("host") or {}
        self.host_ram_available.append(t, _num(host.get("ram_available_bytes")))
        gpu = first_gpu(snap)
        if gpu is None:
            return
        self.vram_used.append(t, _num(gpu.get("memory_used_bytes")))
        self.vram_total.append(t, _num(gpu.get("memory_total_bytes")))
        self.temperature.append(t, _num(gpu.get("temperature_c")))
        self.power.append(t, _num(gpu.get("power_w")))
        self.power_limit.append(t, _num(gpu.get("power_limit_w")))
        self.utilization.append(t, _num(gpu.get("utilization_pct")))
        self._track_throttle(t, is_throttled(gpu))

    def _track_throttle(self, t: float, throttled: bool) -> None:
        open_period = self.throttle_periods and self.throttle_periods[-1][1] is None
        if throttled and not open_period:
            self.throttle_periods.append([t, None])
        elif throttled:
            pass
        elif open_period:
            self.throttle_periods[-1][1] = t

    # -- derived --------------------------------------------------------------------------------
    @property
    def state(self) -> str:
        """The status state, 'failed' when a failed event came last, else 'unknown'."""
        if self.status and self.status.get("state"):
            return str(self.status["state"])
        if self.run_dir is None:
            return "machine (no run selected)"
        return "failed" if self.failure else "unknown"

    def is_alive(self) -> bool:
        """True when status.json names a live supervisor pid in a live state."""
        return self.state in ("starting", "running", "stopping") and pid_alive((self.status or {}).get("pid"))

    def predicted_peak_bytes(self) -> float | None:
        """The planner's predicted peak VRAM (bytes), when plan.json has one for a GPU run."""
        if (self.plan or {}).get("device") == "cpu":
            return None  # a CPU plan's peak is host RAM, not VRAM
        return _num((self.plan or {}).get("predicted_peak_bytes"))

    def effective_batch(self) -> int | None:
        """micro × accumulation from the last step (× GPUs is in the config; one GPU here)."""
        s = self.last_step or {}
        mb, ga = s.get("micro_batch_size"), s.get("gradient_accumulation_steps")
        return int(mb) * int(ga) if isinstance(mb, int) and isinstance(ga, int) else None

    def log_tail(self, lines: int = 40) -> list[str]:
        """The last ``lines`` lines of train.log (reads at most 64 KiB from the end)."""
        if self.run_dir is None:
            return []
        path = self.run_dir / "train.log"
        try:
            with open(path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - LOG_TAIL_BYTES))
                data = fh.read()
        except OSError:
            return []
        text = data.decode("utf-8", errors="replace").replace("\r", "\n")
        return [ln for ln in text.splitlines() if ln.strip()][-lines:]


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

