"""Driven by test_xvfb.py inside a real X server: the real app (xcb platform) as a user uses it: the
wizard to Review; a demo run started, stopped with a checkpoint, resumed; its supervisor and worker
killed with -9 (the runs list, the dashboard, the status bar and ``trainpilot-cli status`` must then say
the same); resumed again to the end.

Clicks go through the X server with xdotool (real pointer events at the widgets' screen positions)
when it is installed, else through Qt. Prints one JSON line of what was seen; exits non-zero on
the first thing that is wrong."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import SHOWN_MS  # this folder's: how long the window may take to show what background work found
from PySide6 import QtCore, QtWidgets
from PySide6.QtTest import QTest

from app.ops import platform_check
from app.views.main_window import KEEP, MainWindow
from trainer.core import entrypoints
from trainer.rundir import events as ev

HARDWARE = str(Path(__file__).resolve().parents[1] / "fixtures" / "hardware" / "no_gpu.jsonl")
XDOTOOL = shutil.which("xdotool")
seen: dict = {"clicks": "xdotool" if XDOTOOL else "qt"}
SHOWN_S = SHOWN_MS / 1000


def wait_until(app, cond, timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for: {what}")
        app.processEvents(QtCore.QEventLoop.AllEvents, 50)
        time.sleep(0.02)


def click(app, widget: QtWidgets.QWidget) -> None:
    """Press ``widget`` as a user would: the pointer moves there and clicks (through X)."""
    wait_until(app, lambda: widget.isVisible() and widget.isEnabled(), SHOWN_S, f"{widget} to be clickable")
    if XDOTOOL:
        centre = widget.mapToGlobal(widget.rect().center())
        subprocess.run([XDOTOOL, "mousemove", "--sync", str(centre.x()), str(centre.y()), "click", "1"], check=True)
        for _ in range(10):
            app.processEvents(QtCore.QEventLoop.AllEvents, 20)
    else:
        QTest.mouseClick(widget, QtCore.Qt.LeftButton)


def toolbar_button(window, action) -> QtWidgets.QWidget:
    return window.findChild(QtWidgets.QToolBar, "runbar").widgetForAction(action)


def row_state(window, run_dir: str) -> str | None:
    """The State column of the run's row in the runs list."""
    name = Path(run_dir).name
    rl = window.run_list
    return next((rl.topLevelItem(i).text(1) for i in range(rl.topLevelItemCount())
                 if rl.topLevelItem(i).text(0) == name), None)


def cli_status(run_dir: str) -> str:
    """What ``trainpilot-cli status RUN --json`` says the run's state is."""
    out = subprocess.run(entrypoints.python_m(entrypoints.CLI, "status", run_dir, "--json"), capture_output=True,
                         text=True, timeout=120)
    return json.loads(out.stdout)["state"] if out.returncode == 0 else f"exit {out.returncode}: {out.stderr}"


def kill_and_compare(app, w, run_dir: str) -> None:
    """kill -9 the supervisor and its worker; then every reader must say the same state."""
    supervisor = w.runs.supervisor_pid(run_dir)
    worker = (ev.read_status(run_dir) or {}).get("worker_pid")
    seen["killed"] = [supervisor, worker]
    for pid in (supervisor, worker):
        if pid:
            os.kill(pid, signal.SIGKILL)
    wait_until(app, lambda: row_state(w, run_dir) == "failed" and w.run_view.dashboard.headline.text().startswith("failed")
               and w.state_label.text().endswith(": failed"), SHOWN_S, "the list, dashboard and status bar to say failed")
    seen["after_kill"] = {"list": row_state(w, run_dir), "status_bar": w.state_label.text().rsplit(": ", 1)[-1],
                          "dashboard": w.run_view.dashboard.headline.text().split(" ", 1)[0], "cli": cli_status(run_dir),
                          "recorded": (ev.read_status(run_dir) or {}).get("state"),
                          "resume_enabled": w.act_resume.isEnabled(), "stop_enabled": w.act_stop.isEnabled()}
    wait_until(app, lambda: w.findChildren(QtWidgets.QMessageBox), SHOWN_S, "the popup saying the run ended")
    for box in w.findChildren(QtWidgets.QMessageBox):  # "… was killed (signal 9, SIGKILL): …": read, then closed
        seen["kill_popup"] = box.text()
        box.close()


def main() -> int:
    assert platform_check.check(), "the xcb libraries are missing"
    app = QtWidgets.QApplication(sys.argv[:1])
    seen["platform"] = app.platformName()
    w = MainWindow(HARDWARE, lazy=True)
    w.ask_close_choice = lambda runs: KEEP
    w.show()
    wait_until(app, lambda: w.started, SHOWN_S, "the window to finish starting")
    # The wizard to Review, pressing Next like a user.
    w.open_wizard()
    wiz = w.wizard
    wait_until(app, lambda: w.hardware.latest is not None, SHOWN_S, "the hardware probe")
    click(app, wiz.button(QtWidgets.QWizard.NextButton))  # to the Model page (the demo model)
    # The demo model reads 512 positions: the wizard proposes 512 (the schema's 2048 is longer) and says so.
    wait_until(app, lambda: "the most this model reads" in wiz.model.facts.text(), SHOWN_S, "the Model page's facts")
    seen["model_facts"] = wiz.model.facts.text()
    while wiz.currentPage() is not wiz.review:
        click(app, wiz.button(QtWidgets.QWizard.NextButton))
    wait_until(app, lambda: wiz.review.result is not None, 60, "Review's checks")
    seen["review"] = wiz.review.message.text()
    seen["review_start_enabled"] = wiz.review.start_button.isEnabled()
    wiz.close()
    # A demo run: start, stop (checkpoint), resume.
    click(app, toolbar_button(w, w.act_demo))
    wait_until(app, lambda: bool(w.runs.children), SHOWN_S, "the demo to launch")
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
    kill_and_compare(app, w, run_dir)
    click(app, toolbar_button(w, w.act_resume))  # Resume is enabled: there is a checkpoint
    wait_until(app, lambda: (ev.read_status(run_dir) or {}).get("state") == "finished", 400, "the run to finish")
    wait_until(app, lambda: row_state(w, run_dir) == "finished" and w.state_label.text().endswith(": finished"),
               SHOWN_S, "the list and the status bar to say finished")
    seen["finished_headline"] = w.run_view.dashboard.headline.text()
    seen["finished_status"] = cli_status(run_dir)
    w.hardware.stop()
    w.close()
    print(json.dumps(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
