"""The app's cyclic garbage is collected on the GUI thread only (app/ops/gui_gc.py): a cycle that a pool thread's
allocations would have collected there (and with it, in the app, a widget deleted off the GUI thread) waits for the
GUI thread's timer. The control case shows the hazard is real: with the collector on, the same cycle dies on the
pool thread."""
from __future__ import annotations

import gc
import threading

from PySide6 import QtWidgets

from app.ops import gui_gc


class _Held:
    """Half of a reference cycle that records the thread it died on."""

    died_on: list = []

    def __init__(self):
        self.me = self

    def __del__(self):
        _Held.died_on.append(threading.current_thread().name)


def _allocate_on_a_pool_thread() -> None:
    def churn():
        junk = []
        for i in range(200_000):  # far past generation 0's threshold (700 allocations): collections would run here
            junk.append([i])
            if len(junk) > 1000:
                junk.clear()
    t = threading.Thread(target=churn, name="pool")
    t.start()
    t.join()


def _one_cycle() -> None:
    _Held()  # unreachable at once: only the cycle collector can free it


def test_a_cycle_made_on_the_gui_thread_dies_on_it_even_when_a_pool_thread_allocates():
    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication([])
    was = gc.isenabled()
    gc.collect()
    _Held.died_on.clear()
    try:
        timer = gui_gc.own_collection(app)
        assert not gc.isenabled() and timer.isActive() and timer.interval() == gui_gc.INTERVAL_MS
        _one_cycle()
        _allocate_on_a_pool_thread()
        assert _Held.died_on == []  # the pool thread's allocations collected nothing
        timer.timeout.emit()  # what the timer does every INTERVAL_MS, on the GUI thread
        assert _Held.died_on == [threading.current_thread().name]
        assert gui_gc.last_pass_ms() is not None
        timer.stop()
    finally:
        if was:
            gc.enable()


def test_with_the_collector_on_the_same_cycle_dies_on_the_pool_thread():
    """The control: Python's own collector frees the GUI thread's cycle on the thread that allocates."""
    was = gc.isenabled()
    gc.enable()
    gc.collect()
    _Held.died_on.clear()
    try:
        _one_cycle()
        _allocate_on_a_pool_thread()
        assert _Held.died_on == ["pool"]
    finally:
        if not was:
            gc.disable()
