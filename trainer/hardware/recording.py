"""Hardware recordings: write probe snapshots to JSONL and replay them as the hardware source.

A recording is one JSON object per line. An optional first line ``{"recording": {...}}`` says
whether the file is a real recording or written from published specs; every other line is a
``MachineSnapshot.to_dict()``. A run's ``telemetry.jsonl`` has the same lines, so it replays too.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Optional

from trainer.core.errors import UserError
from trainer.hardware.probe import MachineSnapshot, Probe


def read_recording(path: str | Path) -> tuple[dict, list[MachineSnapshot]]:
    """(metadata, snapshots) of a recording. A half-written last line is skipped; UserError when
    the file is missing or holds no snapshot."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"hardware recording not found: {p}; record one with 'trainpilot-cli probe --record FILE'",
                        path=str(p))
    meta: dict = {}
    snaps: list[MachineSnapshot] = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue  # a recording cut off mid-line is still usable
        if not isinstance(d, dict):
            continue
        if "recording" in d and "gpus" not in d:
            meta = dict(d["recording"])
            continue
        if "gpus" in d:
            snap = MachineSnapshot.from_dict(d)
            snaps.append(MachineSnapshot(snap.time, snap.gpus, snap.host, snap.note, f"replay:{p.name}"))
    if not snaps:
        raise UserError(f"{p} holds no hardware snapshots (lines with a 'gpus' key); is it a recording?", path=str(p))
    return meta, snaps


class ReplayProbe(Probe):
    """Replays a recording: each ``snapshot()``/``sample()`` returns the next record, then holds the
    last one (``loop=True`` starts over instead)."""

    def __init__(self, path: str | Path, loop: bool = False):
        self.path = str(path)
        self.meta, self.records = read_recording(path)
        self.loop = loop
        self._i = 0

    def snapshot(self) -> MachineSnapshot:
        snap = self.records[min(self._i, len(self.records) - 1)]
        self._i += 1
        if self.loop and self._i >= len(self.records):
            self._i = 0
        return snap

    def sample(self) -> MachineSnapshot:
        return self.snapshot()


def record(probe: Probe, path: str | Path, seconds: float, interval: float = 1.0,
           meta: Optional[dict] = None, clock: Callable[[], float] = time.monotonic,
           sleep: Callable[[float], None] = time.sleep) -> int:
    """Write a metadata line then one full snapshot per ``interval`` seconds for ``seconds``
    seconds (the first and every fifth are full snapshots, the rest light samples). Returns the
    number of snapshots written. Each line is flushed so a killed recording stays readable."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.touch()
    except OSError as exc:
        raise UserError(f"--record: cannot write {p} ({exc.strerror}); choose a file in a folder you can write to",
                        path=str(p)) from None
    head = {"kind": "real", "recorded_at": time.time(), "interval_seconds": interval}
    head.update(meta or {})
    count = 0
    start = clock()
    with p.open("w", encoding="utf-8") as fh:
        fh.write(json.dumps({"recording": head}) + "\n")
        while True:
            snap = probe.snapshot() if count % 5 == 0 else probe.sample()
            fh.write(json.dumps(snap.to_dict()) + "\n")
            fh.flush()
            count += 1
            next_at = start + count * interval
            if next_at - start > seconds:
                return count
            sleep(max(0.0, next_at - clock()))
