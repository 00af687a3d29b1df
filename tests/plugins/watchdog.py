"""A hang watchdog under pytest-timeout's own timer: when a test outlives its timeout by two minutes, faulthandler
prints every thread's stack and ends the process (xdist replaces the worker).

pytest-timeout's alarm is a Python signal handler, which never runs while the main thread waits inside C/C++ holding
the GIL (a Qt wait, a lock): such a test would hang its xdist worker, and the whole suite, until CI's time limit.
faulthandler's watchdog is a C thread. It rides pytest-timeout's hooks (the timeout as pytest-timeout resolved it
from the marker, the command line, the environment and the ini), so it never resolves the timeout again itself."""
from __future__ import annotations

import faulthandler
import os
import sys

import pytest

GRACE_S = 120  # after pytest-timeout's own timeout (seconds)
_OUT: list = [None]  # the terminal's stderr, kept at configure


def pytest_configure(config):
    # kept before any test captures fd 2: what the watchdog prints must outlive the process
    _OUT[0] = os.fdopen(os.dup(sys.__stderr__.fileno()), "w")


@pytest.hookimpl(optionalhook=True)
def pytest_timeout_set_timer(item, settings):
    """Returns None, so pytest-timeout sets its own timer too."""
    faulthandler.dump_traceback_later(settings.timeout + GRACE_S, exit=True, file=_OUT[0] or sys.stderr)


@pytest.hookimpl(optionalhook=True)
def pytest_timeout_cancel_timer(item):
    """With pytest-timeout's timer (the test ended, or pdb was entered) the watchdog stops too. Returns None."""
    faulthandler.cancel_dump_traceback_later()
