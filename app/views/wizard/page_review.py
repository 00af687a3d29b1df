"""Wizard page 5, Review: the YAML, the run folder, Export and Start.

Planning and checking run off the GUI thread (``review_check``); Start stays disabled until they
pass. Every blocking problem is shown with its fix and the page where it is fixed; a failed start
comes back here with the error."""
from __future__ import annotations

import re
from pathlib import Path

from PySide6 import QtCore, QtGui, QtWidgets

from app.model.failed_start import start_failure_words
from app.ops.background import Latest
from app.model.review_checks import ReviewResult, review_check
from app.views.wizard.schema_form import label_for, user_words
from trainer import config as tc

# The fields the wizard's pages edit directly; every other field is under Advanced settings.
PAGE_OF = {"model.source": "Model page", "model.architecture": "Model page", "model.tokenizer": "Model page",
           "data.path": "Data page", "data.record_format": "Data page", "training.objective": "Data page",
           "method.type": "Method page", "data.seq_len": "Method page", "training.max_steps": "Method page",
           "training.epochs": "Method page", "training.learning_rate": "Method page",
           "training.effective_batch_size": "Method page",
           "output.runs_dir": "this page", "output.run_name": "this page"}
RUN_FOLDER_KEYS = ("output.runs_dir", "output.run_name")  # what Review's Run folder field sets


REWARD_PAGE_KEYS = ("rewards", "grpo.system_prompt")  # the Reward page edits these (GRPO runs)


def where(key: str) -> str:
    """The wizard page a dotted key is edited on."""
    if key.startswith(REWARD_PAGE_KEYS):
        return "Rewards page"
    return PAGE_OF.get(key, "Method page → Advanced settings")


class ReviewPage(QtWidgets.QWizardPage):
    """Shows the final config; emits ``start(config_path, run_dir)`` and ``export(config_path)``."""
    start = QtCore.Signal(str, str)
    export = QtCore.Signal(str)

    def __init__(self, state, parent=None):
        super().__init__(parent)
        self.state = state
        self.result: ReviewResult | None = None
        self.start_error: str | None = None
        self.started: tc.RunConfig | None = None  # the config of the last start (a failure is about it)
        self.start_field: tuple[str, str] | None = None
        self.setTitle("Review")
        self.setSubTitle("This is the exact config; the terminal command runs the same thing.")
        self.yaml = QtWidgets.QPlainTextEdit(readOnly=True)
        self.yaml.setFont(QtGui.QFontDatabase.systemFont(QtGui.QFontDatabase.FixedFont))
        self.run_dir = QtWidgets.QLineEdit()
        self.run_dir.editingFinished.connect(self._recheck)
        self.export_button = QtWidgets.QPushButton("Export…", clicked=self._export)
        self.start_button = QtWidgets.QPushButton("Start training", clicked=self._start)
        self.start_button.setStyleSheet("font-weight: bold")
        self.message = QtWidgets.QLabel()
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(QtCore.Qt.TextSelectableByMouse)
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
        self._checks = Latest(self._checked, self._check_failed, self)

    def initializePage(self) -> None:
        if not self.start_error:
            self.run_dir.setText(self.state.default_run_dir())
        self._recheck()

    def _recheck(self) -> None:
        """Check the config and the run folder as they are now (off the GUI thread)."""
        self.result = None
        self._enable(False)
        if self.state.snapshot() is None:  # the plan needs the hardware; the probe answers within a second
            self.message.setText(self._error_prefix() + "Waiting for the hardware probe…")
            QtCore.QTimer.singleShot(300, self, self._recheck)
            return
        try:
            cfg = self.state.config()
        except tc.ConfigError as exc:
            self.yaml.setPlainText("")
            self._show([(k, m) for k, m in exc.problems], [])
            return
        if self.start_error and cfg != self.started:  # the failure was about other settings: not news any more
            self.start_error, self.start_field = None, None
        self.yaml.setPlainText(tc.dump_yaml(cfg))
        self.message.setText(self._error_prefix() + "Planning and checking the model, data and machine…")
        snap, plan, run_dir = self.state.snapshot(), self.state.plan, self.run_dir.text().strip()
        self._checks.submit(lambda: review_check(cfg, plan, snap, run_dir))

    def show_start_failure(self, code: int, text: str) -> None:
        """A start of this config failed (exit ``code``): show why above the checks, mark the field
        the message names (``trainpilot-cli: data.path: …``), then re-check."""
        self.start_error = f"exit code {code}: {start_failure_words(text) or 'no message'}"
        self.start_field = failed_field(text)
        folder = Path(self.run_dir.text().strip())
        if folder.is_dir() and any(folder.iterdir()):  # it now holds the failed start (listed with its log)
            self.run_dir.setText(self.state.default_run_dir())
        self.initializePage()

    def _error_prefix(self) -> str:
        if not self.start_error:
            return ""
        return ("<span style='color:#b00'><b>The last start failed</b> (" + _html(self.start_error) +
                "). Your settings are kept; fix the cause and start again.</span><br>")

    def _checked(self, result: ReviewResult) -> None:
        self.result = result
        self.yaml.setPlainText(tc.dump_yaml(result.config))
        self._show(result.blocking, result.warnings)

    def _check_failed(self, exc: Exception) -> None:
        self._show([("", f"{type(exc).__name__}: {exc}")], [])

    def _show(self, blocking: list, warnings: list) -> None:
        if blocking:
            self.state.problems.emit([p for p in blocking if p[0]])  # beside the fields that caused them
            self.message.setText(self._error_prefix() + "<span style='color:#b00'>Start is blocked until these are "
                                 "fixed (Back to change them):</span><br>" + "<br>".join(
                                     f"<b>{_label(k)}</b> ({where(k)}): {_html(user_words(m))}" if k
                                     else _html(user_words(m))
                                     for k, m in blocking))
        elif self.start_error:
            if self.start_field:
                self.state.problems.emit([self.start_field])
            ready = ("The checks in this window pass, but the start failed for the reason above"
                     + (f" (<b>{label_for(self.start_field[0])}</b>, {where(self.start_field[0])})"
                        if self.start_field else "") + ".")
            self.message.setText(self._error_prefix() + ready)
        else:
            ready = "Ready: the plan fits and the model, data and machine checks passed."
            self.message.setText(self._error_prefix() + ready + "".join(f"<br>⚠ {_html(w)}" for w in warnings))
        self._enable(not blocking)
        self.export_button.setEnabled(self.result is not None)  # exporting a config to fix elsewhere is fine

    def _enable(self, ok: bool) -> None:
        self.start_button.setEnabled(ok)
        self.export_button.setEnabled(ok)

    def _start(self) -> None:
        if self.result is None or self.result.blocking:
            return
        self.start_error, self.start_field = None, None
        self.started = self.state.config()
        path = self.state.write_config(self.run_dir.text(), self.result.config)
        self.start.emit(str(path), self.run_dir.text())

    def _export(self) -> None:
        cfg = self.result.config if self.result is not None else None
        self.export.emit(str(self.state.write_config(self.run_dir.text(), cfg)))


def failed_field(text: str) -> tuple[str, str] | None:
    """(dotted key, message) from the CLI's one-line error ``trainpilot-cli: KEY: message``."""
    keys = {k for k, *_ in tc.field_docs()}
    for line in reversed(text.strip().splitlines()):
        m = re.match(r"(?:trainpilot-cli: )?([a-z_]+(?:\.[a-z_]+)?): (.+)", line.strip())
        if m and m.group(1) in keys:
            return m.group(1), m.group(2)
    return None


def _label(key: str) -> str:
    return "Run folder" if key in RUN_FOLDER_KEYS else label_for(key)


def _html(text: str) -> str:
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\n", "<br>")
