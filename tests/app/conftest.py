"""GUI tests run offscreen with real widgets, and never touch the user's home (TRAINPILOT_HOME)."""
from __future__ import annotations

import gc
import os
import shutil
import sys
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

# How long a GUI test waits for what the window shows once background work is done (a hardware snapshot, a run folder
# read, a plan, a child's answer): milliseconds when idle, seconds on a loaded 2-core CI machine. An upper bound, not
# a duration: qtbot.waitUntil returns as soon as its condition holds, so a generous bound costs nothing and a tight
# one fails at random (a 5 s wait for the first hardware snapshot did, under load).
SHOWN_MS = 30_000


@pytest.fixture(autouse=True)
def trainpilot_home(tmp_path, monkeypatch):
    """A fresh settings/runs folder per test."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("TRAINPILOT_HOME", str(home))
    monkeypatch.delenv("TRAINPILOT_HARDWARE", raising=False)
    return home


@pytest.fixture(autouse=True)
def quiet_background():
    """After each GUI test: stop hardware monitors and wait for background work, so a test
    (failing or not) leaves no thread that delivers into the next test's deleted widgets (seen: a segfault or an
    import-lock hang several tests later); then collect the test's cyclic garbage here, on the GUI thread. Left to
    the collector, a cycle holding a widget is freed by whichever thread allocates next: a later test's background
    scan (150,000 records read in a pool thread) deleted earlier tests' widgets off the GUI thread — a segfault
    in test_page_data here, and on CI a 12-minute hang past pytest-timeout."""
    yield
    from PySide6 import QtWidgets

    app = QtWidgets.QApplication.instance()
    if app is None:
        return
    from app.ops import background, hardware_feed

    hardware_feed.stop_all()  # (windows are not closed here: a window with a live run would ask what to do)
    background.abandon_background()  # as the app quitting does: the verdicts nobody will read stop at their next model
    background.wait_for_background(120_000)  # returns when what is running (one plan, one child) is done
    app.processEvents()
    gc.collect()  # (widgets in cycles die on this thread, with nothing running beside it)
    app.processEvents()  # their deleteLater()s


@pytest.fixture
def fixture_run(tmp_path):
    """Copy a fixture run directory into tmp (tests may append to it)."""
    def copy(name: str) -> Path:
        dst = tmp_path / "runs" / name
        shutil.copytree(FIXTURES / "run_dirs" / name, dst)
        return dst
    return copy


def started_wizard(qtbot, hardware: str):
    """The setup wizard on a replayed recording, shown, once its hardware monitor has the first snapshot (ms when
    idle, seconds on a loaded CI machine)."""
    from app.ops.hardware_feed import HardwareMonitor
    from app.views.wizard.wizard import SetupWizard

    hw = HardwareMonitor(hardware)
    hw.start()
    wiz = SetupWizard(hw)
    qtbot.addWidget(wiz)
    wiz.show()
    qtbot.waitUntil(lambda: hw.latest is not None, timeout=SHOWN_MS)
    return wiz
