"""Formatting for people: bytes, durations, times (the probe and events carry raw units)."""
from __future__ import annotations

import time

# The one formatters of bytes, durations and counts, as the CLI prints them.
from trainer.core.units import count, duration, gib  # noqa: F401


def clock(t: float | None) -> str:
    """Unix seconds as local 'YYYY-MM-DD HH:MM'."""
    if not t:
        return ""
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))
