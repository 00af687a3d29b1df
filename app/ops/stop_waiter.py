""""Stop and save" on closing: wait, with the event loop running, until each run has stopped.

The stop request (the STOP file) is already written when this starts. The dialog says what it is
waiting for: the run's acknowledgement (status ``stopping``), then the checkpoint and the exit. The
user may close meanwhile: the run then still saves and stops by itself (it does not need the window).
"""
from __future__ import annotations

from pathlib import Path

from PySide6 import QtCore, QtWidgets

from trainer.rundir.runstate import read_run_state

def close_question(runs: list[str]) -> str:
    """The question on closing with live runs, naming each and how far it is: "run-a (step 23 of 40) is still
    training. What should happen to it?" (a question that named no run left the user guessing which)."""
    named = []
    for run in runs:
        rs = read_run_state(run)
        where = f" (step {rs.step} of {rs.max_steps})" if rs.step is not None and rs.max_steps else ""
        named.append(f"{Path(run).name}{where}")
    if len(named) == 1:
        return f"{named[0]} is still training. What should happen to it?"
    return f"{len(named)} runs are still training: {', '.join(named)}. What should happen to them?"


ACK_TIMEOUT_S = 60.0  # a step longer than this is unusual: say so instead of waiting silently


def run_phase(run_dir: str) -> str:
    """'asked' (not acknowledged yet), 'saving' (acknowledged, or stopped and exiting), or 'done'
    (neither the supervisor nor its worker is alive any more)."""
    rs = read_run_state(run_dir)
    if not rs.alive:
        return "done"
    return "saving" if rs.recorded_state in ("stopping", "stopped", "finished", "failed") else "asked"


class StopWaiter(QtWidgets.QDialog):
    """``wait()`` → True once every run is done or the user pressed Close now."""

    def __init__(self, runs: list[str], parent=None):
        super().__init__(parent)
        self.setWindowTitle("Stopping training")
        self.runs = list(runs)
        self.label = QtWidgets.QLabel()
        self.label.setWordWrap(True)
        self.close_now = QtWidgets.QPushButton("Close now (the run still saves and stops)")
        self.close_now.clicked.connect(self.accept)
        bar = QtWidgets.QProgressBar()
        bar.setRange(0, 0)
        lay = QtWidgets.QVBoxLayout(self)
        lay.addWidget(self.label)
        lay.addWidget(bar)
        lay.addWidget(self.close_now)
        self._elapsed = QtCore.QElapsedTimer()
        self._timer = QtCore.QTimer(self, interval=250, timeout=self._check)

    def wait(self) -> bool:
        """Block (event loop running) until done; True to close the window."""
        self._elapsed.start()
        self._check()
        if self.result() == QtWidgets.QDialog.Accepted:
            return True
        self._timer.start()
        return self.exec() == QtWidgets.QDialog.Accepted or all(run_phase(r) == "done" for r in self.runs)

    def _check(self) -> None:
        phases = {r: run_phase(r) for r in self.runs}
        if all(p == "done" for p in phases.values()):
            self._timer.stop()
            self.setResult(QtWidgets.QDialog.Accepted)
            self.accept()
            return
        lines = []
        for r, p in phases.items():
            name = Path(r).name
            if p == "saving":
                lines.append(f"{name}: stop acknowledged, saving a checkpoint…")
            elif p == "asked" and self._elapsed.elapsed() > ACK_TIMEOUT_S * 1000:
                lines.append(f"{name}: no answer after {ACK_TIMEOUT_S:.0f} s. The stop request is written; "
                             "the run acts on it at the end of its current step, which is taking long.")
            elif p == "asked":
                lines.append(f"{name}: stop requested, waiting for the end of the current step…")
        self.label.setText("\n".join(lines))
