"""``app.ops.background.Latest``: a result reaches the GUI thread, only the newest one, and never a page
that was closed while its task ran (that once crashed the process: the per-page bridge was deleted
while the worker thread emitted on it)."""
from __future__ import annotations

import threading
import time

from PySide6 import QtCore, QtWidgets

from app.ops.background import Latest, own_pool


def _app():
    return QtWidgets.QApplication.instance() or QtWidgets.QApplication([])


def _wait(pred, timeout=5.0):
    end = time.time() + timeout
    while time.time() < end and not pred():
        QtCore.QCoreApplication.processEvents()
        time.sleep(0.01)
    return pred()


def test_the_newest_result_arrives_on_the_gui_thread():
    _app()
    got, threads = [], []

    def on_result(value):
        got.append(value)
        threads.append(threading.current_thread() is threading.main_thread())

    latest = Latest(on_result, lambda exc: got.append(exc), pool=own_pool(2))
    latest.submit(lambda: (time.sleep(0.2), "old")[1])
    latest.submit(lambda: "new")
    assert _wait(lambda: not latest.busy)
    time.sleep(0.3)
    QtCore.QCoreApplication.processEvents()
    assert got == ["new"] and threads == [True]


RACE = """
from PySide6 import QtCore, QtWidgets
from app.ops.background import Latest, own_pool
app = QtWidgets.QApplication([])
pool, delivered = own_pool(4), []
for i in range(3000):
    page = QtWidgets.QWidget()
    latest = Latest(delivered.append, delivered.append, parent=page, pool=pool)
    latest.submit(lambda: sum(range(2000)))
    page.deleteLater()
    QtCore.QCoreApplication.sendPostedEvents(None, QtCore.QEvent.Type.DeferredDelete)
    if i % 50 == 0:
        QtCore.QCoreApplication.processEvents()
pool.waitForDone(10000)
QtCore.QCoreApplication.processEvents()
print("delivered", len(delivered))
"""


def test_pages_closed_while_their_tasks_finish_get_nothing_and_nothing_crashes():
    """3,000 pages closed the moment their task is submitted: with a bridge per page this segfaulted
    (exit 139) in 3 runs out of 3; the process must finish and deliver nothing to a closed page."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True, timeout=120, cwd=root,
                         env=dict(os.environ, QT_QPA_PLATFORM="offscreen"))
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert out.stdout.split() == ["delivered", "0"]


def _items(log: list, n: int = 200):
    """Work of ``n`` items (a verdict per model) that asks ``wanted()`` between them; ``log`` counts the items."""
    def work(wanted):
        for i in range(n):
            if not wanted():
                return "partial"
            log.append(i)
            time.sleep(0.01)
        return "all"
    return work


def test_a_newer_request_stops_the_older_abandonable_work_at_its_next_item():
    """Judging every shipped model takes seconds: a listing asked again (a setting changed) must not first judge
    the rest of the old one for nobody (they queued one behind another in the picker's one thread)."""
    _app()
    got, old, new = [], [], []
    latest = Latest(got.append, got.append, pool=own_pool(1))
    latest.submit_abandonable(_items(old))
    assert _wait(lambda: len(old) >= 3)
    latest.submit_abandonable(_items(new, 5))
    assert _wait(lambda: not latest.busy)
    assert got == ["all"] and new == list(range(5))
    assert len(old) < 100, f"the old work went on for {len(old)} of 200 items"


def test_abandoning_stops_running_work_drops_queued_work_and_delivers_nothing():
    """Windows closing for good (the app quitting, a test's teardown): what runs stops at its next item, what waits
    in a queue never starts, and nothing submitted before is delivered — even plain ``submit`` work."""
    from app.ops.background import abandon_background, wait_for_background

    _app()
    got, running, queued = [], [], []
    pool = own_pool(1)
    first = Latest(got.append, got.append, pool=pool)
    second = Latest(got.append, got.append, pool=pool)
    first.submit_abandonable(_items(running))
    second.submit_abandonable(_items(queued))
    plain = Latest(got.append, got.append, pool=own_pool(1))
    plain.submit(lambda: (time.sleep(0.2), "plain")[1])
    assert _wait(lambda: len(running) >= 3)
    abandon_background()
    assert wait_for_background(10_000)
    time.sleep(0.05)
    QtCore.QCoreApplication.processEvents()
    assert got == [] and queued == [] and len(running) < 100
    first.submit_abandonable(_items([], 2))  # work submitted afterwards is delivered as ever
    assert _wait(lambda: not first.busy) and got == ["all"]
