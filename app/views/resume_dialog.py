"""Resume on how many GPUs: the run's count first (or all of this machine's, when it has fewer), what another count
changes said as the CLI says it, a count that cannot keep the effective batch refused where it is chosen
(``app/model/resume_choice.py``); Resume starts ``trainpilot-cli resume`` with that count."""
from __future__ import annotations

from PySide6 import QtCore, QtWidgets

from app.model import resume_choice
from app.views.wizard.numbers import SpinBox


class ResumeDialog(QtWidgets.QDialog):
    """Pick the number of GPUs; ``chosen`` carries the ``--set`` items when Resume is pressed."""

    chosen = QtCore.Signal(list)

    def __init__(self, run_dir: str, snapshot, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Resume")
        self.setMinimumWidth(520)  # wrapped labels take their height from the width (seen clipped under Xvfb at 230)
        self.run_dir, self.snapshot = run_dir, snapshot
        least, most, first = resume_choice.choice_range(run_dir, snapshot)
        trained = resume_choice.run_gpus(run_dir)[0]
        have = resume_choice.machine_gpus(snapshot)
        intro = QtWidgets.QLabel(f"This run trained on {trained} GPU{'s' if trained != 1 else ''}; this machine has "
                                 f"{have}. It continues from its newest complete checkpoint with the same effective "
                                 "batch: on another number of GPUs the accumulation is split anew.")
        intro.setWordWrap(True)
        self.gpus = SpinBox(least, most, key="distributed.num_gpus", tip="GPUs to resume on")
        self.gpus.setValue(first)
        self.effect = QtWidgets.QLabel()
        self.effect.setWordWrap(True)
        self.buttons = QtWidgets.QDialogButtonBox(QtWidgets.QDialogButtonBox.Cancel)
        self.resume_button = self.buttons.addButton("Resume", QtWidgets.QDialogButtonBox.AcceptRole)
        self.buttons.accepted.connect(self._accept)
        self.buttons.rejected.connect(self.reject)
        form = QtWidgets.QFormLayout()
        form.addRow("GPUs", self.gpus)
        lay = QtWidgets.QVBoxLayout(self)
        lay.addWidget(intro)
        lay.addLayout(form)
        lay.addWidget(self.effect)
        lay.addWidget(self.buttons)
        self.gpus.valueChanged.connect(self._judge)
        self._judge()

    def _judge(self) -> None:
        words, ok = resume_choice.consequence(self.run_dir, self.gpus.value(), self.snapshot)
        self.effect.setText(words)
        self.effect.setStyleSheet("" if ok else "color:#c0392b")
        self.resume_button.setEnabled(ok)

    def _accept(self) -> None:
        if not self.resume_button.isEnabled():
            return
        self.chosen.emit(resume_choice.overrides(self.run_dir, self.gpus.value()))
        self.accept()
