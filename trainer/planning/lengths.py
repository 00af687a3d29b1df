"""Which sequence lengths the planner tries when it looks for the longest that fits: one grid, one home (issue 40),
so ``plan --max-seq``, the wizard's longest context (``planning.longest``) and a plan's "shorter sequences"
alternative (``planning.alternatives``) give one answer for one run. Tokens. No torch.

The lengths are multiples of ``step`` (``STEP`` unless ``plan --seq-step`` says otherwise), searched by bisection
(a longer sequence never needs less memory); where not even ``step`` tokens fit (or the search must stay below
``step``), the halvings step/2, step/4, … down to ``SHORTEST`` tokens, longest first.
"""
from __future__ import annotations

from typing import Callable, Optional, TypeVar

STEP = 1024  # tokens: the lengths tried are multiples of this
SHORTEST = 256  # tokens: the shortest length tried (below a step)

T = TypeVar("T")


def below_step(step: int, top: int) -> list[int]:
    """The lengths tried below ``step``, longest first: step/2, step/4, … down to ``SHORTEST``, none over ``top``."""
    out, n = [], step // 2
    while n >= SHORTEST:
        if n <= top:
            out.append(n)
        n //= 2
    return out


def shortest(step: int) -> int:
    """The shortest length the grid tries for ``step`` (tokens)."""
    below = below_step(step, step)
    return below[-1] if below else step


def next_up(tokens: int, step: int) -> int:
    """The length the grid tries after ``tokens`` (``tokens`` on it): the next multiple of ``step``, or below a step
    the next halving up."""
    return tokens + step if tokens >= step else min(step, 2 * tokens)


def longest_fitting(fits: Callable[[int], Optional[T]], top: int, step: int = STEP) -> tuple[int, Optional[T]]:
    """The longest length on the grid, at most ``top`` tokens, for which ``fits`` answers (not None), with that
    answer: (tokens, answer), or (0, None) when not even ``SHORTEST`` tokens fit."""
    lo, hi, best = 0, max(0, top) // step, None  # fits at lo·step (0: nothing checked yet); not above hi·step
    while lo < hi:
        mid = (lo + hi + 1) // 2
        found = fits(mid * step)
        if found is not None:
            lo, best = mid, found
        else:
            hi = mid - 1
    if lo:
        return lo * step, best
    for tokens in below_step(step, top):
        found = fits(tokens)
        if found is not None:
            return tokens, found
    return 0, None
