"""Units, defined once. Memory is counted in bytes and printed in GiB (2**30 bytes) everywhere:
the CLI, the plan, the GUI. ``gib()`` is the one formatter, so the same number reads the same."""
from __future__ import annotations

import math
from typing import Optional

GIB = 2**30
MIB = 2**20
LEAST_PRINTED = GIB // 20  # bytes: the least amount gib() prints as more than 0.0 GiB


def gib(n: Optional[float], digits: int = 1) -> str:
    """``n`` bytes as ``"12.3 GiB"``; ``"?"`` when unknown (None)."""
    return "?" if n is None else f"{n / GIB:.{digits}f} GiB"


def duration(seconds: Optional[float]) -> str:
    """Seconds for people: '2 h 5 min', '3 min 4 s' or '12 s'; '?' when unknown (None). The one
    duration formatter (CLI progress, plan, GUI)."""
    if seconds is None:
        return "?"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60} min"
    if s >= 60:
        return f"{s // 60} min {s % 60} s"
    return f"{s} s"


def count(n: Optional[float]) -> str:
    """A parameter (or token) count for people: '1.24 B', '135 M', '4.1 M', '512 K', '158'; '?' when
    unknown. The one count formatter (tiny models show their real count, not '0.00 B')."""
    if n is None:
        return "?"
    if n >= 999.5e6:  # 999.9 M reads as 1.00 B, not "1000 M"
        return f"{n / 1e9:.2f} B"
    if n >= 999.5e3:
        return f"{n / 1e6:.1f} M" if n < 9.95e6 else f"{n / 1e6:.0f} M"
    return f"{n / 1e3:.0f} K" if n >= 1e3 else f"{int(n)}"


def gib_difference(total: float, parts: list[tuple[str, float]], result: str, digits: int = 1) -> str:
    """``total − part − part … = result`` in GiB, printed so that the printed numbers add up exactly.

    ``parts`` are ``(words, bytes)`` subtracted from ``total`` (bytes); what is left is the last term, named
    ``result``. The total and the result are rounded as ``gib()`` rounds them everywhere else; the parts between
    are rounded by the largest remainder (the way shares are rounded to sum to 100%), so each is within one last
    digit of its true value and the printed subtraction holds (16.0 − 0.3 − 12.2 − 0.3 = 3.2, never = 3.3)."""
    scale = 10 ** digits
    left = total - sum(b for _, b in parts)
    top, rest = round(total / GIB * scale), round(left / GIB * scale)
    exact = [b / GIB * scale for _, b in parts]
    shown = [math.floor(x) for x in exact]
    order = sorted(range(len(exact)), key=lambda i: exact[i] - shown[i], reverse=True)
    missing = top - rest - sum(shown)
    for i in (order * 2)[:max(0, missing)]:
        shown[i] += 1
    for i in (order[::-1] * 2)[:max(0, -missing)]:
        shown[i] -= 1
    terms = " − ".join(f"{v / scale:.{digits}f} GiB {words}" for v, (words, _) in zip(shown, parts))
    return f"{top / scale:.{digits}f} GiB − {terms} = {rest / scale:.{digits}f} GiB {result}"
