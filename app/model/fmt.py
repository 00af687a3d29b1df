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


def count(n: float | None) -> str:
    """A parameter (or token) count for people: '135 M', '1.24 B', '4.1 M', '512 K'; '?' when unknown."""
    if n is None:
        return "?"
    if n >= 1e9:
        return f"{n / 1e9:.2f} B"
    if n >= 1e6:
        return f"{n / 1e6:.1f} M" if n < 1e7 else f"{n / 1e6:.0f} M"
    return f"{n / 1e3:.0f} K" if n >= 1e3 else f"{int(n)}"
