"""``trainpilot``: the desktop app's entry point (a gui-script: no console window).

``--smoke-exit`` / ``TRAINPILOT_SMOKE_EXIT=1`` shows the main window and exits 0 after the first
paint (the installer's launch test). ``--hardware FILE`` / ``TRAINPILOT_HARDWARE`` replays a trace.
"""
from __future__ import annotations

import argparse
import os
import sys

from app.ops import gui_gc, platform_check
from app.ops import settings


def _args(argv):
    p = argparse.ArgumentParser(prog="trainpilot", description="TrainPilot desktop app")
    p.add_argument("--hardware", help="replay a recorded hardware trace (.jsonl) instead of NVML")
    p.add_argument("--smoke-exit", action="store_true", help="exit 0 after the first paint (install check)")
    p.add_argument("--run", help="open this run folder")
    p.add_argument("--wizard", action="store_true", help="open the setup wizard")
    return p.parse_known_args(argv)[0]


def main(argv: list[str] | None = None) -> int:
    """Start the app; returns the exit code."""
    args = _args(sys.argv[1:] if argv is None else argv)
    smoke = args.smoke_exit or os.environ.get("TRAINPILOT_SMOKE_EXIT") == "1"
    if not platform_check.check():
        return 1  # Qt would abort with only "could not load the Qt platform plugin"; we said which library
    from PySide6 import QtCore, QtWidgets

    from app.views.main_window import MainWindow

    QtWidgets.QApplication.setApplicationName("TrainPilot")
    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication(sys.argv[:1])
    gui_gc.own_collection(app)  # cycles are collected on the GUI thread only, never on a pool thread
    window = MainWindow(settings.hardware_file(args.hardware), lazy=True)
    if args.run:
        window.open_run(args.run)
    window.show()
    first_launch = settings.settings().value("wizard_seen") is None
    if (args.wizard or first_launch) and not smoke:
        settings.settings().setValue("wizard_seen", 1)
        QtCore.QTimer.singleShot(0, window.open_wizard)
    if smoke:
        _exit_after_first_paint(window, app)
    return app.exec()


def _exit_after_first_paint(window, app) -> None:
    from PySide6 import QtCore

    # Exit once the window has painted AND the deferred startup (plots, probe) has run, so a
    # broken install fails this check instead of passing on an empty window.
    state = {"painted": False}

    def maybe_exit():
        if state["painted"] and window.started:
            QtCore.QTimer.singleShot(0, lambda: app.exit(0))

    class _PaintWatch(QtCore.QObject):
        def eventFilter(self, obj, event):
            if event.type() == QtCore.QEvent.Paint and not state["painted"]:
                state["painted"] = True
                maybe_exit()
            return False

    watch = _PaintWatch(window)
    window.installEventFilter(watch)
    window.startup_done.connect(maybe_exit)
    QtCore.QTimer.singleShot(10000, lambda: app.exit(0))  # offscreen platforms may never paint


if __name__ == "__main__":
    sys.exit(main())
