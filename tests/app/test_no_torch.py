"""The GUI never imports torch: open the main window and every wizard page in a fresh interpreter."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = r"""
import sys
from PySide6 import QtCore, QtWidgets
app = QtWidgets.QApplication([])
from app.views.main_window import MainWindow
w = MainWindow(sys.argv[1])
w.show()
w.open_wizard()
wiz = w.wizard
def spin(ms):
    t = QtCore.QElapsedTimer(); t.start()
    while t.elapsed() < ms:
        app.processEvents(); QtCore.QThread.msleep(10)
spin(500)
for _ in range(4):
    wiz.next(); spin(700)
QtCore.QThreadPool.globalInstance().waitForDone(10000)
heavy = sorted(m for m in ("torch", "transformers", "deepspeed", "peft", "datasets", "accelerate") if m in sys.modules)
print("PAGE", type(wiz.currentPage()).__name__, "HEAVY", heavy)
w.hardware.stop()
"""


@pytest.mark.slow  # measured >= 3.5 s on the 2-core machine
def test_main_window_and_wizard_never_import_torch(tmp_path):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", TRAINPILOT_HOME=str(tmp_path))
    hw = str(ROOT / "tests" / "fixtures" / "hardware" / "rtx4090_laptop_16gb.jsonl")
    out = subprocess.run([sys.executable, "-c", SCRIPT, hw], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "PAGE ReviewPage HEAVY []" in out.stdout, out.stdout + out.stderr[-2000:]
