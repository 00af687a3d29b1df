"""Wizard page Rewards (GRPO only): which built-in rewards score the answers and how much each weighs (with their
parameters), a Python file of the user's own reward functions, the system prompt, and Preview: the base model's
answers to a few prompts, scored, from ``python -m trainer.worker.probes.reward_preview`` in a background child.

Every field binds one ``rewards.*`` / ``grpo.*`` key of the WizardState as typed (a weight is the number in its
box; a path is the text in the field). Next is refused while no reward is on; problems show beside their field.
"""
from __future__ import annotations

import html

from PySide6 import QtCore, QtWidgets

from app.model.grpo_setup import (
    BUILTIN_LABELS, BUILTIN_PARAMS, NO_REWARD, builtin_help, builtin_what, has_reward, parse_tolerance, preview_summary,
    preview_table, python_file_problem,
)
from app.ops import commands, settings
from app.views.wizard.numbers import DoubleSpinBox, SpinBox, field_minimum
from trainer import config as tc
from trainer.config.sections import RewardsConfig
from trainer.data.rewards import BUILTIN_NAMES

RED = "<span style='color:#b00'>{}</span>"


def _esc(text: str) -> str:
    return html.escape(text, quote=False)
DEFAULT_WEIGHT = 1.0  # what a box shows before the user ticks its reward (the schema's default weight is 0: off)


class RewardPage(QtWidgets.QWizardPage):
    """Binds rewards.* and grpo.system_prompt; runs the preview child; ``isComplete`` needs a reward."""

    grpo_only = True  # the Data page skips this page unless training.objective is grpo

    def __init__(self, state, parent=None):
        super().__init__(parent)
        self.state = state
        self.setTitle("Rewards")
        self.setSubTitle("GRPO samples several answers per prompt and learns from the better ones: the rewards say "
                         "which are better. Tick the ones that fit your data, or give your own in a Python file.")
        self.ticks: dict[str, QtWidgets.QCheckBox] = {}
        self.weights: dict[str, QtWidgets.QDoubleSpinBox] = {}
        self.params: dict[str, QtWidgets.QWidget] = {}
        self.errors: dict[str, QtWidgets.QLabel] = {}   # dotted key → the problem shown beside its field
        self._job = None
        self.preview_doc: dict | None = None
        lay = QtWidgets.QVBoxLayout(self)
        lay.addWidget(self._builtins_box())
        lay.addWidget(self._python_box())
        lay.addWidget(self._preview_box(), 1)
        self.problem = QtWidgets.QLabel()
        self.problem.setWordWrap(True)
        self.problem.setTextInteractionFlags(QtCore.Qt.TextSelectableByMouse)
        lay.addWidget(self.problem)
        state.problems.connect(self._show_problems)

    # -- building -------------------------------------------------------------------------------
    def _builtins_box(self) -> QtWidgets.QGroupBox:
        box = QtWidgets.QGroupBox("Built-in rewards (weight: how much each counts in the total)")
        grid = QtWidgets.QGridLayout(box)
        grid.setColumnStretch(2, 1)
        for row, name in enumerate(BUILTIN_NAMES):
            tick = QtWidgets.QCheckBox(BUILTIN_LABELS[name])
            tick.setToolTip(builtin_help(name))
            weight = DoubleSpinBox(field_minimum(RewardsConfig.model_fields[name]), key=f"rewards.{name}",
                                   tip=f"rewards.{name}: {RewardsConfig.model_fields[name].description or ''}")
            weight.setValue(DEFAULT_WEIGHT)
            weight.setEnabled(False)
            tick.toggled.connect(lambda on, n=name: self._ticked(n, on))
            weight.valueChanged.connect(lambda _v, n=name: self._weighed(n))
            self.ticks[name], self.weights[name] = tick, weight
            grid.addWidget(tick, row, 0)
            grid.addWidget(weight, row, 1)
            grid.addLayout(self._param_row(name), row, 2)
        row = len(BUILTIN_NAMES)
        grid.addWidget(QtWidgets.QLabel("Reference answer field:"), row, 0)
        grid.addLayout(self._line_row("rewards.answer_field", "answer"), row, 1, 1, 2)
        grid.addWidget(QtWidgets.QLabel("Answer pattern:"), row + 1, 0)
        grid.addLayout(self._line_row("rewards.answer_pattern", "default: <answer>…</answer>, else after ####"),
                       row + 1, 1, 1, 2)
        grid.addWidget(QtWidgets.QLabel("System prompt:"), row + 2, 0)
        grid.addLayout(self._line_row("grpo.system_prompt", "e.g. Think in <think>…</think>, then answer in "
                                      "<answer>…</answer>."), row + 2, 1, 1, 2)
        return box

    def _param_row(self, name: str) -> QtWidgets.QHBoxLayout:
        row = QtWidgets.QHBoxLayout()
        help_text = QtWidgets.QLabel(builtin_what(name))
        help_text.setStyleSheet("color:#555")
        help_text.setToolTip(builtin_help(name))
        row.addWidget(help_text)
        for param in BUILTIN_PARAMS.get(name, ()):
            row.addWidget(QtWidgets.QLabel(f"{param.replace('_', ' ')}:"))
            if param == "length_target":
                edit = SpinBox(field_minimum(RewardsConfig.model_fields[param]), key=f"rewards.{param}")
                edit.setValue(int(self.state.values[f"rewards.{param}"]))
                edit.valueChanged.connect(lambda v, k=f"rewards.{param}": self.state.set(k, v))
                row.addWidget(edit)
            else:
                row.addLayout(self._line_row(f"rewards.{param}", ""), 1)
                edit = self.params[f"rewards.{param}"]
            edit.setToolTip(RewardsConfig.model_fields[param].description or "")
            self.params[f"rewards.{param}"] = edit
        row.addStretch(0)
        return row

    def _line_row(self, key: str, placeholder: str) -> QtWidgets.QVBoxLayout:
        """A text field bound to ``key`` (its text as typed, on editingFinished) with its error under it."""
        value = self.state.values.get(key)
        edit = QtWidgets.QLineEdit("" if value is None else (f"{value:g}" if isinstance(value, float) else str(value)))
        edit.setPlaceholderText(placeholder)
        edit.editingFinished.connect(lambda k=key: self._typed(k))
        error = QtWidgets.QLabel()
        error.setWordWrap(True)
        error.hide()
        self.params[key], self.errors[key] = edit, error
        col = QtWidgets.QVBoxLayout()
        col.setSpacing(0)
        col.addWidget(edit)
        col.addWidget(error)
        return col

    def _python_box(self) -> QtWidgets.QGroupBox:
        box = QtWidgets.QGroupBox("Your own reward functions (optional)")
        lay = QtWidgets.QGridLayout(box)
        self.python = QtWidgets.QLineEdit(self.state.values.get("rewards.python") or "")
        self.python.setPlaceholderText("a .py file: def my_reward(prompts, completions, **kwargs) -> list of numbers")
        self.python.setToolTip(RewardsConfig.model_fields["python"].description or "")
        self.python.editingFinished.connect(self._python_typed)
        self.params["rewards.python"] = self.python
        browse = QtWidgets.QPushButton("File…", clicked=self._browse)
        self.errors["rewards.python"] = error = QtWidgets.QLabel()
        error.setWordWrap(True)
        error.hide()
        lay.addWidget(self.python, 0, 0)
        lay.addWidget(browse, 0, 1)
        lay.addWidget(error, 1, 0, 1, 2)
        return box

    def _preview_box(self) -> QtWidgets.QGroupBox:
        box = QtWidgets.QGroupBox("Preview: the base model's answers, scored")
        lay = QtWidgets.QVBoxLayout(box)
        row = QtWidgets.QHBoxLayout()
        self.n_prompts = SpinBox(1, 64, tip="How many of your prompts the preview samples answers for.")
        self.n_prompts.setValue(3)
        self.n_completions = SpinBox(1, 64, tip="How many answers the preview samples for each prompt.")
        self.n_completions.setValue(4)
        self.preview_button = QtWidgets.QPushButton("Preview", clicked=self.start_preview)
        self.cancel_button = QtWidgets.QPushButton("Cancel", clicked=self.cancel_preview)
        self.cancel_button.hide()
        self.preview_status = QtWidgets.QLabel("Samples answers with the base model and scores them with the "
                                               "rewards above (loads the model: seconds to minutes).")
        self.preview_status.setWordWrap(True)
        self.preview_status.setTextInteractionFlags(QtCore.Qt.TextSelectableByMouse)
        for w in (QtWidgets.QLabel("Prompts:"), self.n_prompts, QtWidgets.QLabel("answers each:"), self.n_completions,
                  self.preview_button, self.cancel_button):
            row.addWidget(w)
        row.addWidget(self.preview_status, 1)
        self.table = QtWidgets.QTableWidget()
        self.table.setEditTriggers(QtWidgets.QAbstractItemView.NoEditTriggers)
        self.table.setWordWrap(True)
        self.table.verticalHeader().hide()
        lay.addLayout(row)
        lay.addWidget(self.table, 1)
        return box

    # -- binding --------------------------------------------------------------------------------
    def initializePage(self) -> None:
        for name in BUILTIN_NAMES:
            weight = self.state.values.get(f"rewards.{name}") or 0.0
            self.ticks[name].blockSignals(True)
            self.ticks[name].setChecked(weight > 0)
            self.ticks[name].blockSignals(False)
            self.weights[name].setEnabled(weight > 0)
            if weight > 0:
                self.weights[name].blockSignals(True)
                self.weights[name].setValue(weight)
                self.weights[name].blockSignals(False)
        self._python_typed()
        self._refresh()

    def _ticked(self, name: str, on: bool) -> None:
        self.weights[name].setEnabled(on)
        self.state.set(f"rewards.{name}", self.weights[name].value() if on else 0.0)
        self._refresh()

    def _weighed(self, name: str) -> None:
        if self.ticks[name].isChecked():
            self.state.set(f"rewards.{name}", self.weights[name].value())
            self._refresh()

    def _typed(self, key: str) -> None:
        text = self.params[key].text()
        if key == "rewards.numeric_tolerance":
            try:
                value = parse_tolerance(text)
            except ValueError as exc:
                self._field_error(key, f"{key}: '{text}' is not a tolerance ({exc}); type a number such as 1e-6")
                return
            self.state.set(key, value)
        elif key in ("rewards.answer_pattern", "grpo.system_prompt"):
            self.state.set(key, text if text.strip() else None)  # empty: the default behaviour
        else:
            self.state.set(key, text)
        self._field_error(key, None)
        self._refresh()

    def _python_typed(self) -> None:
        text = self.python.text().strip()
        if text != (self.state.values.get("rewards.python") or ""):
            self.state.set("rewards.python", text or None)
        self._field_error("rewards.python", python_file_problem(text))
        self._refresh()

    def _browse(self) -> None:
        name, _ = QtWidgets.QFileDialog.getOpenFileName(self, "Reward functions", "", "Python (*.py)")
        if name:
            self.python.setText(name)
            self._python_typed()

    def _field_error(self, key: str, message: str | None) -> None:
        label = self.errors.get(key)
        if label is None:
            return
        label.setText(RED.format(_esc(message)) if message else "")
        label.setVisible(bool(message))

    def _show_problems(self, problems: list) -> None:
        """The config's problems about rewards/GRPO, each beside its field (or under the page)."""
        if not self.isVisible():
            return
        loose = []
        for key in self.errors:
            if key != "rewards.python" and key != "rewards.numeric_tolerance":
                self._field_error(key, None)
        for key, message in problems:
            if key in self.errors and key != "rewards.python":
                self._field_error(key, message)
            elif key.startswith(("rewards", "grpo")):
                loose.append(f"{key}: {message}" if key else message)
        self.problem.setText(RED.format(_esc("\n".join(loose))) if loose else "")

    def _refresh(self) -> None:
        if not has_reward(self.state.values):
            self.problem.setText(RED.format(_esc(NO_REWARD)))
        elif self.problem.text() and NO_REWARD in html.unescape(self.problem.text()):
            self.problem.setText("")
        self.completeChanged.emit()

    def isComplete(self) -> bool:
        """A reward is on and the Python file, if named, exists."""
        return has_reward(self.state.values) and python_file_problem(self.python.text()) is None

    # -- preview (child process) ----------------------------------------------------------------------
    def start_preview(self) -> None:
        """Write the config as edited and run the preview child; the table fills when it answers."""
        self.cancel_preview()
        if not self.isComplete():
            self.preview_status.setText(RED.format(_esc(python_file_problem(self.python.text()) or NO_REWARD)))
            return
        path = settings.home() / "configs" / "reward-preview.yaml"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(tc.dump_yaml(self.state.config()), encoding="utf-8")
        except (tc.ConfigError, OSError) as exc:
            text = exc.render() if isinstance(exc, tc.ConfigError) else str(exc)
            self.preview_status.setText(RED.format(_esc(f"the config is not valid yet: {text}")))
            return
        self.preview_doc = None
        job = commands.reward_preview(str(path), self.n_prompts.value(), self.n_completions.value(), parent=self)
        job.done.connect(lambda code, *_a, job=job: self._preview_done(job, code))
        self._job = job.start()
        self.preview_status.setText("Loading the model and sampling answers…")
        self.preview_button.setEnabled(False)
        self.cancel_button.show()

    def cancel_preview(self) -> None:
        """Stop a preview still running (leaving the page, or Cancel)."""
        job, self._job = self._job, None
        if job is not None:
            job.done.disconnect()
            job.cancel()
            job.wait(3000)
            self.preview_status.setText("Preview cancelled.")
        self.preview_button.setEnabled(True)
        self.cancel_button.hide()

    @property
    def previewing(self) -> bool:
        """True while the preview child runs."""
        return self._job is not None

    def _preview_done(self, job, code: int) -> None:
        self._job = None
        self.preview_button.setEnabled(True)
        self.cancel_button.hide()
        doc = job.json() if code == 0 else None
        if not isinstance(doc, dict):
            self.preview_status.setText(RED.format(_esc(f"Preview failed: {job.error_text()}")))
            return
        self.show_preview(doc)

    def show_preview(self, doc: dict) -> None:
        """Fill the table from a reward preview document."""
        self.preview_doc = doc
        headers, rows = preview_table(doc)
        self.table.clear()
        self.table.setColumnCount(len(headers))
        self.table.setRowCount(len(rows))
        self.table.setHorizontalHeaderLabels(headers)
        for i, row in enumerate(rows):
            for j, text in enumerate(row):
                item = QtWidgets.QTableWidgetItem(text[:400])
                item.setToolTip(text[:2000])
                if j >= 3:
                    item.setTextAlignment(QtCore.Qt.AlignCenter)
                self.table.setItem(i, j, item)
        header = self.table.horizontalHeader()
        for j in range(len(headers)):
            header.setSectionResizeMode(j, QtWidgets.QHeaderView.Stretch if j in (0, 2) else
                                        QtWidgets.QHeaderView.ResizeToContents)
        # Three lines a row at most (a base model can ramble for hundreds of tokens): the whole text is in the tooltip.
        self.table.verticalHeader().setSectionResizeMode(QtWidgets.QHeaderView.Fixed)
        self.table.verticalHeader().setDefaultSectionSize(3 * self.table.fontMetrics().lineSpacing() + 8)
        self.preview_status.setText(_esc(preview_summary(doc)) + f" ({doc.get('seconds', 0):.0f} s)")

    # -- leaving ----------------------------------------------------------------------------------
    def cleanupPage(self) -> None:
        """Back: stop the preview (its answers are for these settings only)."""
        self.cancel_preview()

    def validatePage(self) -> bool:
        """Next: stop the preview; go on only with a reward."""
        self.cancel_preview()
        return self.isComplete()

    def hideEvent(self, event) -> None:
        self.cancel_preview()  # the wizard closed or moved on some other way
        super().hideEvent(event)
