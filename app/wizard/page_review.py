"""Wizard page 5, Review: the YAML, the run folder, Export and Start."""
from __future__ import annotations

from PySide6 import QtCore, QtGui, QtWidgets

from app.background import Latest
from trainer import config as tc
from trainer.supervisor import preflight as pf


def preflight(cfg, snapshot) -> list[tuple[str, str]]:
    """The trainer's checks of files and machine (light: no torch); [] when Start will work."""
    try:
        pf.check(cfg, snapshot)
    except tc.ConfigError as exc:
        return exc.problems
    return []


class ReviewPage(QtWidgets.QWizardPage):
    """Shows the final config; emits ``start(config_path, run_dir)`` and ``export(config_path)``."""
    start = QtCore.Signal(str, str)
    export = QtCore.Signal(str)

    def __init__(self, state, parent=None):
        super().__init__(parent)
        self.state = state
        self.setTitle("Review")
        self.setSubTitle("This is the exact config; the terminal command runs the same thing.")
        self.yaml = QtWidgets.QPlainTextEdit(readOnly=True)
        self.yaml.setFont(QtGui.QFontDatabase.systemFont(QtGui.QFontDatabase.FixedFont))
        self.run_dir = QtWidgets.QLineEdit()
        self.export_button = QtWidgets.QPushButton("Export…", clicked=self._export)
        self.start_button = QtWidgets.QPushButton("Start training", clicked=self._start)
        self.start_button.setStyleSheet("font-weight: bold")
        self.message = QtWidgets.QLabel()
        self.message.setWordWrap(True)
        row = QtWidgets.QHBoxLayout()
        row.addWidget(QtWidgets.QLabel("Run folder:"))
        row.addWidget(self.run_dir, 1)
        buttons = QtWidgets.QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.export_button)
        buttons.addWidget(self.start_button)
        lay = QtWidgets.QVBoxLayout(self)
        lay.addWidget(self.yaml, 1)
        lay.addLayout(row)
        lay.addWidget(self.message)
        lay.addLayout(buttons)
        self._checks = Latest(self._checked, lambda exc: self._checked([("", str(exc))]), self)

    def initializePage(self) -> None:
        self.run_dir.setText(self.state.default_run_dir())
        try:
            cfg = self.state.final_config()
        except tc.ConfigError as exc:
            self.yaml.setPlainText("")
            self.message.setText(exc.render())
            self._enable(False)
            return
        self.yaml.setPlainText(tc.dump_yaml(cfg))
        self.message.setText("Checking the model, data and machine…")
        self._enable(False)
        snap = self.state.snapshot()
        self._checks.submit(lambda: preflight(cfg, snap))

    def _checked(self, problems: list) -> None:
        if problems:
            self.message.setText("<span style='color:#b00'>Fix before starting (Back to change it):</span><br>"
                                 + "<br>".join(f"<b>{k}</b>: {m}" if k else m for k, m in problems))
        else:
            self.message.setText("Ready: the model, data and machine checks passed.")
        self._enable(not problems)
        self.export_button.setEnabled(True)  # exporting a config to fix elsewhere is fine

    def _enable(self, ok: bool) -> None:
        self.start_button.setEnabled(ok)
        self.export_button.setEnabled(ok)

    def _start(self) -> None:
        path = self.state.write_config(self.run_dir.text())
        self.start.emit(str(path), self.run_dir.text())

    def _export(self) -> None:
        self.export.emit(str(self.state.write_config(self.run_dir.text())))
