"""Run a function off the GUI thread and get its result back on the GUI thread.

Used for work that may take a moment (planning, reading a dataset, finding a model's config):
the GUI stays responsive, and only the newest request of a ``Latest`` is delivered. Work submitted with
``submit_abandonable`` is handed a ``wanted()`` to ask between its items (a verdict per model): once a newer
request of the same ``Latest`` came, it was cancelled, or ``abandon_background`` ran (windows closing for good), it
stops there instead of judging the rest for nobody.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable

import shiboken6
from PySide6 import QtCore


class _Bridge(QtCore.QObject):
    """One for the whole app, never deleted: a worker thread emits on it, and Qt queues the delivery to
    the GUI thread. (A bridge per ``Latest``, owned by its page, could be deleted by Qt while a worker
    was emitting on it — a segfault seen once under load when a page closed with a task in flight.)"""

    done = QtCore.Signal(object, object, object, object)  # weakref to the Latest, token, result, exception

    def deliver(self, ref, token, result, error) -> None:
        latest = ref()
        if latest is not None and shiboken6.isValid(latest):  # the page that asked may be gone
            latest._deliver(token, result, error)


_BRIDGE: _Bridge | None = None


def _bridge() -> _Bridge:
    """The app's bridge, created on first use (by a ``Latest``, i.e. on the GUI thread)."""
    global _BRIDGE
    if _BRIDGE is None:
        _BRIDGE = _Bridge()
        _BRIDGE.done.connect(_BRIDGE.deliver)
    return _BRIDGE


_GENERATION = [0]  # bumped by abandon_background: every task started before it is no longer wanted


class _Task(QtCore.QRunnable):
    """Runs ``fn(wanted)`` in a pool and delivers its result (or exception) through the bridge."""

    def __init__(self, fn: Callable[[Callable[[], bool]], Any], latest: "Latest", token: object):
        super().__init__()
        self.fn, self.ref, self.token, self.bridge = fn, weakref.ref(latest), token, _bridge()
        self.generation = _GENERATION[0]

    def wanted(self) -> bool:
        """Whether the result can still be delivered: its ``Latest`` is alive, has asked nothing newer, and
        nothing abandoned the app's background work since it was submitted (any thread may ask)."""
        latest = self.ref()
        return (self.generation == _GENERATION[0] and latest is not None and shiboken6.isValid(latest)
                and latest._token == self.token)

    def run(self) -> None:
        try:
            result, error = self.fn(self.wanted), None
        except Exception as exc:  # delivered to the GUI, which shows it
            result, error = None, exc
        if self.generation == _GENERATION[0]:
            self.bridge.done.emit(self.ref, self.token, result, error)


class Latest(QtCore.QObject):
    """Calls ``on_result(result)`` or ``on_error(exc)`` for the newest ``submit`` only."""

    def __init__(self, on_result: Callable[[Any], None], on_error: Callable[[Exception], None], parent=None,
                 pool: QtCore.QThreadPool | None = None):
        super().__init__(parent)
        self._pool = pool
        _bridge()  # made here, on the GUI thread, so its deliveries run there
        self._on_result, self._on_error = on_result, on_error
        self._token = 0
        self.busy = False

    def submit(self, fn: Callable[[], Any]) -> None:
        """Run ``fn()`` in the global thread pool (older pending results will be dropped)."""
        self.submit_abandonable(lambda _wanted: fn())

    def submit_abandonable(self, fn: Callable[[Callable[[], bool]], Any]) -> None:
        """Like ``submit``, for work of many items: ``fn(wanted)`` asks ``wanted()`` between them and returns at
        once when it is False (what it returns then is never delivered)."""
        self._token += 1
        self.busy = True
        (self._pool or QtCore.QThreadPool.globalInstance()).start(_Task(fn, self, self._token))

    def cancel(self) -> None:
        """Drop the result of any pending call (it still runs to completion)."""
        self._token += 1
        self.busy = False

    def _deliver(self, token, result, error) -> None:
        if token != self._token:
            return
        self.busy = False
        if error is not None:
            self._on_error(error)
        else:
            self._on_result(result)


# Every private pool lives as long as the app: a pool is never destroyed (nor its threads, with a task's Python state)
# while the widget that made it is torn down, and ``wait_for_background`` sees them all. An idle pool holds no thread
# once its threads expire (30 s), so keeping one per picker or monitor ever made costs a small object each.
_POOLS: list[QtCore.QThreadPool] = []


def own_pool(threads: int = 1) -> QtCore.QThreadPool:
    """A private pool (work in it never waits behind planning in the global pool, nor the reverse)."""
    pool = QtCore.QThreadPool()
    pool.setMaxThreadCount(threads)
    _POOLS.append(pool)
    return pool


def _pools() -> list[QtCore.QThreadPool]:
    return [QtCore.QThreadPool.globalInstance(), *[p for p in _POOLS if shiboken6.isValid(p)]]


def abandon_background() -> None:
    """Windows are closing for good: tasks not started yet are dropped, abandonable ones running stop at their next
    item, and nothing submitted so far is delivered."""
    _GENERATION[0] += 1
    for pool in _pools():
        pool.clear()


def wait_for_background(timeout_ms: int = 10000) -> bool:
    """Wait until the global pool and every private pool are idle (True) or ``timeout_ms`` passed (False).
    Called when windows close for good (the app quitting, a test's teardown), after ``abandon_background``: a task
    still running could otherwise deliver into widgets that are being deleted."""
    return all(pool.waitForDone(timeout_ms) for pool in _pools())
