"""The worker's standard output while it trains: written in blocks, at most once a second, not once a step.

The supervisor starts the worker with ``PYTHONUNBUFFERED=1`` and reads its output through a pipe into ``train.log``
(``supervise._pump``). HF's ``PrinterCallback`` prints the log dict of every optimizer step (``logging_steps=1``:
a ``step`` event per step is the product), and each unbuffered print is a write to that pipe that wakes the
supervisor's reading thread: a context switch a step, in which the worker can lose its core. Profiled on the CPU demo
(``benchmarks/overhead.py``'s config, 100 steps, 2-core machine under load): ``print`` took 3.9 ms a call in the
supervised worker against 0.10 ms with the same worker's output in a file — the largest per-step cost the worker had
over a bare ``transformers.Trainer`` script (whose tqdm bar writes to a file). ``PacedOutput`` makes stdout
block-buffered while training runs and flushes it every ``FLUSH_SECONDS`` (at the next step end after that), at
every save and evaluation, and when training ends; stderr (warnings, tracebacks) stays unbuffered. What is lost if
the worker is killed hard: at most the last second of per-step log lines, which ``events.jsonl`` holds as well.
"""
from __future__ import annotations

import sys
import time

from transformers import TrainerCallback

FLUSH_SECONDS = 1.0  # train.log trails the worker by at most this (plus one step)


class PacedOutput(TrainerCallback):
    """Block-buffered stdout during ``train()``, flushed at most once per ``FLUSH_SECONDS`` (module doc)."""

    def __init__(self, stream=None):
        self.stream = stream
        self._last = 0.0
        self._was = None  # the stream's (line_buffering, write_through), restored when training ends

    def on_train_begin(self, args, state, control, **kw):
        self.stream = self.stream or sys.stdout
        try:
            self._was = (self.stream.line_buffering, self.stream.write_through)
            self.stream.reconfigure(line_buffering=False, write_through=False)
        except (AttributeError, ValueError, OSError):  # not a TextIOWrapper (a test's capture): leave it as it is
            self._was = None
        self._last = time.monotonic()

    def on_step_end(self, args, state, control, **kw):
        now = time.monotonic()
        if now - self._last >= FLUSH_SECONDS:
            self._flush(now)

    def on_save(self, args, state, control, **kw):
        self._flush(time.monotonic())

    def on_evaluate(self, args, state, control, **kw):
        self._flush(time.monotonic())

    def on_train_end(self, args, state, control, **kw):
        self._flush(time.monotonic())
        if self._was is not None:
            self.stream.reconfigure(line_buffering=self._was[0], write_through=self._was[1])
            self._was = None

    def _flush(self, now: float) -> None:
        self._last = now
        try:
            self.stream.flush()
        except (AttributeError, ValueError, OSError):  # closed or gone: nothing more to say through it
            pass
