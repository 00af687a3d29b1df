"""Telemetry snapshots → chart columns: the one home of which snapshot field feeds which series.

Both the run's ``telemetry.jsonl`` (read on the reader thread) and the GUI's own probe (the machine
view) go through ``TelemetryColumns.parse``; ``RunData`` appends what it returns. A snapshot is a
``MachineSnapshot.to_dict()``: ``time`` (Unix seconds), ``host.ram_available_bytes`` and the first GPU's
fields below — and the same fields of every card, per NVML index (a run on several cards: a curve per card). Samples further apart than ``GAP_S`` are separate stretches (a stop, then a resume): a
NaN row goes between them, in the GPU columns only when the GPU was sampled on both sides, so a CPU
run's GPU charts stay empty after a resume.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from app.model.facts import first_gpu, is_throttled

GAP_S = 10.0  # telemetry samples further apart than this are separate stretches of the run (seconds)
# series name → the first GPU's snapshot field (bytes, °C, W, %)
GPU_FIELDS = {"vram_used": "memory_used_bytes", "vram_total": "memory_total_bytes", "temp": "temperature_c",
              "power": "power_w", "power_limit": "power_limit_w", "util": "utilization_pct"}
_T, _RAM, _HAS_GPU, _FIRST_GPU = 0, 1, 2, 3  # row layout: time, host RAM available, GPU sampled, GPU fields


@dataclass
class Columns:
    """Parsed samples: ``t`` and ``ram`` for every sample (gap rows NaN), ``gpu_t`` and ``gpu`` (series
    name → values) for the samples that had a GPU, the newest snapshot, and whether the throttling
    periods changed (or one is still open and grows with time)."""

    t: np.ndarray
    ram: np.ndarray
    gpu_t: np.ndarray | None = None
    gpu: dict = field(default_factory=dict)
    last_snapshot: dict | None = None
    throttle_changed: bool = False
    # every card's own columns, NVML index → (times, {series name → values}) with gap rows as above: a run on
    # several cards draws a curve per card (the first card's are ``gpu_t``/``gpu`` too); names: index → name
    cards: dict = field(default_factory=dict)
    card_names: dict = field(default_factory=dict)


class TelemetryColumns:
    """Turns snapshots into columns, remembering across calls the last sample's time (for gaps) and
    the throttling periods (``throttle``: [start, end or None] Unix seconds)."""

    def __init__(self):
        self._last_t: float | None = None
        self._card_last_t: dict[int, float] = {}  # per card: its last sample's time (its own gaps)
        self.throttle: list[list] = []

    def parse(self, snaps: list[dict]) -> Columns | None:
        """Columns for ``snaps`` (in time order); None when none has a time."""
        rows, last, changed = [], None, False
        for snap in snaps:
            row = snapshot_row(snap)
            if row is None:
                continue
            rows.append(row)
            last = snap
            gpus = _gpus(snap)
            if gpus:  # shaded while any card the run uses throttles (the warnings name which)
                changed = self._track_throttle(row[_T], any(is_throttled(g) for g in gpus)) or changed
        if not rows:
            return None
        arr = np.array(rows, dtype=np.float64)
        t = arr[:, _T]
        prev = np.concatenate(([self._last_t if self._last_t is not None else t[0]], t[:-1]))
        self._last_t = float(t[-1])
        arr = _insert_gap_rows(arr, t - prev > GAP_S, prev)
        out = Columns(arr[:, _T], arr[:, _RAM], last_snapshot=last)
        g = arr[arr[:, _HAS_GPU] == 1]
        if len(g):
            out.gpu_t = g[:, _T]
            out.gpu = {name: g[:, i] for i, name in enumerate(GPU_FIELDS, start=_FIRST_GPU)}
        out.throttle_changed = changed or bool(self.throttle and self.throttle[-1][1] is None)
        out.cards, out.card_names = self._cards(snaps)
        return out

    def _cards(self, snaps: list[dict]) -> tuple[dict, dict]:
        """Each card's columns (NVML index → (t, {name: values})), gap rows where that card's samples are further
        apart than ``GAP_S``, and each card's name."""
        rows: dict[int, list] = {}
        names: dict[int, str] = {}
        for snap in snaps:
            t = _num(snap.get("time"))
            for g in _gpus(snap) if t is not None else ():
                index = g.get("index")
                if isinstance(index, int):
                    rows.setdefault(index, []).append((t, 0.0, 1.0, *(_nan(g.get(k)) for k in GPU_FIELDS.values())))
                    names[index] = str(g.get("name") or f"GPU {index}")
        out = {}
        for index, card_rows in rows.items():
            arr = np.array(card_rows, dtype=np.float64)
            t = arr[:, _T]
            last = self._card_last_t.get(index, t[0])
            prev = np.concatenate(([last], t[:-1]))
            self._card_last_t[index] = float(t[-1])
            arr = _insert_gap_rows(arr, t - prev > GAP_S, prev)
            out[index] = (arr[:, _T], {name: arr[:, i] for i, name in enumerate(GPU_FIELDS, start=_FIRST_GPU)})
        return out, names

    def _track_throttle(self, t: float, throttled: bool) -> bool:
        open_period = bool(self.throttle) and self.throttle[-1][1] is None
        if throttled and not open_period:
            self.throttle.append([t, None])
            return True
        if not throttled and open_period:
            self.throttle[-1][1] = t
            return True
        return False


def snapshot_row(snap: dict) -> tuple | None:
    """(time, host RAM available, 1 if a GPU was sampled, *GPU_FIELDS values) with NaN for what is
    missing; None without a time."""
    t = _num(snap.get("time"))
    if t is None:
        return None
    gpu = first_gpu(snap)
    g = gpu or {}
    host = snap.get("host") or {}
    return (t, _nan(host.get("ram_available_bytes")), float(gpu is not None),
            *(_nan(g.get(key)) for key in GPU_FIELDS.values()))


def _insert_gap_rows(arr: np.ndarray, breaks: np.ndarray, prev_t: np.ndarray) -> np.ndarray:
    """``arr`` with a gap row before each row where ``breaks`` is True: its time is the midpoint of
    the gap (x stays finite and sorted for clip-to-view), every value NaN (the line breaks). The gap
    belongs to the GPU columns when the sample after it had a GPU (a CPU run's stay empty)."""
    idx = np.flatnonzero(breaks)
    if not len(idx):
        return arr
    rows = np.full((len(idx), arr.shape[1]), np.nan)
    rows[:, _T] = (arr[idx, _T] + prev_t[idx]) / 2
    rows[:, _HAS_GPU] = arr[idx, _HAS_GPU]
    return np.insert(arr, idx, rows, axis=0)


def _gpus(snap: dict) -> list[dict]:
    """The cards of a snapshot dict (the run's cards only, in a run's telemetry: docs/gpus.md)."""
    return [g for g in (snap or {}).get("gpus") or [] if isinstance(g, dict)]


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _nan(v) -> float:
    n = _num(v)
    return np.nan if n is None else n
