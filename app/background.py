"""Run a function off the GUI thread and get its result back on the GUI thread.

Used for work that may take a moment (planning, reading a dataset, finding a model's config):
the GUI stays responsive, and only the newest request of a ``Latest`` is delivered.
"""
from __future__ import annotations

from typing import Any, Callable

from PySide6 import QtCore


class _Bridge(QtCore.QObject):
    done = QtCore.Signal(object, object, object)  # token, result, exception


class _Task(QtCore.QRunnable):
    def __init__(self, fn: Callable[[], Any], bridge: _Bridge, token: object):
        super().__init__()
        self.fn, self.bridge, self.token = fn, bridge, token

    def run(self) -> None:
        try:
            result, error = self.fn(), None
        except Exception as exc:  # delivered to the GUI, which shows it
            result, error = None, exc
        try:
            self.bridge.done.emit(self.token, result, error)
        except RuntimeError:
            pass  # the page that asked was closed meanwhile: nobody wants the result


class Latest(QtCore.QObject):
    """Calls ``on_result(result)`` or ``on_error(exc)`` for the newest ``submit`` only."""

    def __init__(self, on_result: Callable[[Any], None], on_error: Callable[[Exception], None], parent=None,
                 pool: QtCore.QThreadPool | None = None):
        super().__init__(parent)
        self._pool = pool
        self._bridge = _Bridge(self)
        self._bridge.done.connect(self._deliver)
        self._on_result, self._on_error = on_result, on_error
        self._token = 0
        self.busy = False

    def submit(self, fn: Callable[[], Any]) -> None:
        """Run ``fn()`` in the global thread pool (older pending results will be dropped)."""
        self._token += 1
        self.busy = True
        (self._pool or QtCore.QThreadPool.globalInstance()).start(_Task(fn, self._bridge, self._token))

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


def own_pool(threads: int = 1) -> QtCore.QThreadPool:
    """A private pool (work in it never waits behind planning in the global pool, nor the reverse)."""
    pool = QtCore.QThreadPool()
    pool.setMaxThreadCount(threads)
    return pool
