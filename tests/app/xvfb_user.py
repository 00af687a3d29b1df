"""Driven by test_xvfb.py inside a real X server: the real app (xcb platform) as a user uses it.

Clicks go through the X server with xdotool (real pointer events at the widgets' screen positions)
when it is installed, else through Qt. Prints one JSON line of what was seen; exits non-zero on
the first thing that is wrong."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from PySide6 import QtCore, QtWidgets
from PySide6.QtTest import QTest

from app.ops import platform_check
from app.views.main_window import KEEP, MainWindow
from trainer.rundir import events as ev

HARDWARE = str(Path(__file__).resolve().parents[1] / "fixtures" / "hardware" / "no_gpu.jsonl")
XDOTOOL = shutil.which("xdotool")
seen: dict = {"clicks": "xdotool" if XDOTOOL else "qt"}


def wait_until(app, cond, timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for: {what}")
        app.processEvents(QtCore.QEventLoop.AllEvents, 50)
        time.sleep(0.02)


def click(app, widget: QtWidgets.QWidget) -> None:
    """Press ``widget`` as a user would: the pointer moves there and clicks (through X)."""
    wait_until(app, lambda: widget.isVisible() and widget.isEnabled(), 30, f"{widget} to be clickable")
    if XDOTOOL:
        centre = widget.mapToGlobal(widget.rect().center())
        subprocess.run([XDOTOOL, "mousemove", "--sync", str(centre.x()), str(centre.y()), "click", "1"], check=True)
        for _ in range(10):
            app.processEvents(QtCore.QEventLoop.AllEvents, 20)
    else:
        QTest.mouseClick(widget, QtCore.Qt.LeftButton)


def toolbar_button(window, action) -> QtWidgets.QWidget:
    return window.findChild(QtWidgets.QToolBar, "runbar").widgetForAction(action)


def main() -> int:
    assert platform_check.check(), "the xcb libraries are missing"
    app = QtWidgets.QApplication(sys.argv[:1])
    seen["platform"] = app.platformName()
    w = MainWindow(HARDWARE, lazy=True)
    w.ask_close_choice = lambda runs: KEEP
    w.show()
    wait_until(app, lambda: w.started, 20, "the window to finish starting")
    # The wizard to Review, pressing Next like a user.
    w.open_wizard()
    wiz = w.wizard
    wait_until(app, lambda: w.hardware.latest is not None, 10, "the hardware probe")
    while wiz.currentPage() is not wiz.review:
        click(app, wiz.button(QtWidgets.QWizard.NextButton))
    wait_until(app, lambda: wiz.review.result is not None, 60, "Review's checks")
    seen["review"] = wiz.review.message.text()
    seen["review_start_enabled"] = wiz.review.start_button.isEnabled()
    wiz.close()
    # A demo run: start, stop (checkpoint), resume.
    click(app, toolbar_button(w, w.act_demo))
    wait_until(app, lambda: bool(w.runs.children), 10, "the demo to launch")
    run_dir = next(iter(w.runs.children))
    seen["run_dir"] = run_dir
    wait_until(app, lambda: w.monitor.current is not None and str(w.monitor.current.run_dir) == str(Path(run_dir).resolve())
               and len(w.monitor.current.loss) >= 2, 240, "two steps on the dashboard")
    click(app, toolbar_button(w, w.act_stop))
    wait_until(app, lambda: (ev.read_status(run_dir) or {}).get("state") == "stopped", 120, "the run to stop")
    seen["stopped_at"] = ev.read_status(run_dir)["step"]
    seen["checkpoints"] = sorted(p.name for p in (Path(run_dir) / "checkpoints").glob("checkpoint-*"))
    click(app, toolbar_button(w, w.act_resume))
    wait_until(app, lambda: (w.monitor.current.last_step or {}).get("step", 0) > seen["stopped_at"], 240,
               "steps after the resume")
    seen["resumed_to"] = w.monitor.current.last_step["step"]
    seen["headline"] = w.run_view.dashboard.headline.text()
    w.runs.stop(run_dir)
    wait_until(app, lambda: (ev.read_status(run_dir) or {}).get("state") in ("stopped", "finished"), 120, "the final stop")
    w.hardware.stop()
    w.close()
    print(json.dumps(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
