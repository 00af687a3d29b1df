"""Growable numpy columns for plot data: amortised O(1) append, zero-copy views for setData.

Buffers are preallocated and double when full (docs/design.md, "The GPU and the GUI"), so a day of 1 Hz
samples costs ~17 allocations, not 86,400.
"""
from __future__ import annotations

import numpy as np


class Series:
    """Parallel float64 columns ``x`` and ``y`` (NaN marks a missing value)."""

    def __init__(self, capacity: int = 1024):
        self._x = np.empty(capacity, dtype=np.float64)
        self._y = np.empty(capacity, dtype=np.float64)
        self.n = 0
        self.version = 0  # bumped on every change, so views redraw only what moved
        self.has_nan = False  # lets plots skip pyqtgraph's full-array finite checks while False

    def _grow(self, need: int) -> None:
        cap = len(self._x)
        while cap < need:
            cap *= 2
        for name in ("_x", "_y"):
            old = getattr(self, name)
            new = np.empty(cap, dtype=np.float64)
            new[: self.n] = old[: self.n]
            setattr(self, name, new)

    def append(self, x: float, y: float | None) -> None:
        """Add one point (``x`` finite); ``y`` None becomes NaN (a gap in the line)."""
        if self.n == len(self._x):
            self._grow(self.n + 1)
        self._x[self.n] = x
        if y is None or y != y:
            self.has_nan = True
        self._y[self.n] = np.nan if y is None else y
        self.n += 1
        self.version += 1

    def extend(self, xs, ys) -> None:
        """Add many points at once (arrays of equal length)."""
        xs = np.asarray(xs, dtype=np.float64)
        ys = np.asarray(ys, dtype=np.float64)
        need = self.n + len(xs)
        if need > len(self._x):
            self._grow(need)
        self._x[self.n:need] = xs
        self._y[self.n:need] = ys
        self.has_nan = self.has_nan or bool(np.isnan(ys).any()) or bool(np.isnan(xs).any())
        self.n = need
        self.version += 1

    def drop_after(self, x: float) -> None:
        """Drop the points whose x is beyond ``x`` (the steps a run resumed from an older checkpoint redoes: the chart
        shows one lineage, not both attempts)."""
        keep = self._x[: self.n] <= x
        if keep.all():
            return
        n = int(keep.sum())
        self._x[:n], self._y[:n] = self._x[: self.n][keep], self._y[: self.n][keep]
        self.n = n
        self.has_nan = bool(np.isnan(self._y[:n]).any())
        self.version += 1

    @property
    def x(self) -> np.ndarray:
        """View of the filled x values."""
        return self._x[: self.n]

    @property
    def y(self) -> np.ndarray:
        """View of the filled y values."""
        return self._y[: self.n]

    def last(self) -> float | None:
        """The newest non-NaN y value, or None."""
        for i in range(self.n - 1, max(-1, self.n - 64), -1):
            if not np.isnan(self._y[i]):
                return float(self._y[i])
        return None

    def has_values(self) -> bool:
        """True when at least one y is a number (a series of gap rows only has none)."""
        return self.n > 0 and (not self.has_nan or not bool(np.isnan(self._y[: self.n]).all()))

    def __len__(self) -> int:
        return self.n
