"""Units, defined once. Memory is counted in bytes and printed in GiB (2**30 bytes) everywhere:
the CLI, the plan, the GUI. ``gib()`` is the one formatter, so the same number reads the same."""
from __future__ import annotations

from typing import Optional

GIB = 2**30
MIB = 2**20


def gib(n: Optional[float], digits: int = 1) -> str:
    """``n`` bytes as ``"12.3 GiB"``; ``"?"`` when unknown (None)."""
    return "?" if n is None else f"{n / GIB:.{digits}f} GiB"
