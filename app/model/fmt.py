"""Formatting for people: bytes, durations, times (the probe and events carry raw units)."""
from __future__ import annotations

import time

from trainer.core.units import gib  # noqa: F401 (the one formatter: '15.9 GiB', as the CLI prints)


def duration(seconds: float | None) -> str:
    """Seconds as '2 h 5 min', '3 min 4 s' or '12 s'."""
    if seconds is None:
        return "?"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60} min"
    if s >= 60:
        return f"{s // 60} min {s % 60} s"
    return f"{s} s"


def clock(t: float | None) -> str:
    """Unix seconds as local 'YYYY-MM-DD HH:MM'."""
    if not t:
        return ""
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))
