"""Python's cyclic garbage collector, run on the GUI thread only.

CPython collects cycles on whichever thread happens to allocate past the threshold. When that is a pool thread (a
data scan, a plan made in the background) and a cycle holds a Qt wrapper, the widget is deleted off the GUI thread —
Qt's rule broken, and a crash some time later (seen in the test suite: a segfault while a pool thread scanned 150,000
records, after earlier widgets' cycles were collected there). The cure Anki uses (aqt: the garbage collection timer)
is the one here: the automatic collector is off, and a timer on the GUI thread collects every ``INTERVAL_MS``
(and where a view asks, ``collect_now``). What the window made at start is frozen (``gc.freeze`` in
``MainWindow``), so a pass walks only what was made since.
"""
from __future__ import annotations

import gc
import time

INTERVAL_MS = 5000  # cycles wait at most this long; a pass after start walks only the objects made since
_last_ms: list[float] = []  # the duration of each pass (milliseconds), newest last, for the tests and the log


def own_collection(parent):
    """Turn the automatic collector off and collect from a timer on ``parent``'s (the GUI) thread (a QObject;
    returns the QTimer). Qt is imported here: ``app.main`` imports this module before it checks Qt can load."""
    from PySide6 import QtCore

    gc.disable()
    timer = QtCore.QTimer(parent)
    timer.setObjectName("gui_gc")
    timer.timeout.connect(collect_now)
    timer.start(INTERVAL_MS)
    return timer


def collect_now() -> int:
    """One full collection, here on the GUI thread; returns what it freed."""
    start = time.perf_counter()
    freed = gc.collect()
    _last_ms.append((time.perf_counter() - start) * 1000)
    del _last_ms[:-20]
    return freed


def last_pass_ms() -> float | None:
    return _last_ms[-1] if _last_ms else None
