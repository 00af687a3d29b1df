"""Wizard page 4, Method and plan: full / LoRA / QLoRA, sequence length, effective batch; the
planner's preset, settings, memory breakdown against the budget, verdict, reasons, apps to close;
and the schema-generated advanced form."""
from __future__ import annotations

import typing

from PySide6 import QtCore, QtWidgets

from app.model.plan_settings import applicable
from app.model.fmt import gib
from app.model.planning import TRAIN_VISION_WORDS, longest_words, picture_cost_words
from app.views.wheel_guard import ComboBox
from app.views.wizard.card_bars import CardBars
from app.views.wizard.card_picker import CardPicker
from app.views.wizard.memory_bar import MemoryBar
from app.views.wizard.numbers import SpinBox, field_minimum
from app.views.wizard.schema_form import FieldEdit, SchemaForm, inline_label, label_for, user_words
from app.views.wizard.step_options import StepOptions
from trainer import config as tc
from trainer.planning.verdict import method_verdict

VERDICT_COLOR = {"fits": "#2ca02c", "tight": "#d68910", "does_not_fit": "#d62728", "needs": "#d62728"}


class PlanPage(QtWidgets.QWizardPage):
    """Binds method/seq_len/batch to the state and shows each new plan."""

    def __init__(self, state, parent=None):
        super().__init__(parent)
        self.state = state
        self.setTitle("Method and plan")
        self.setSubTitle("Choose how to train; the planner fits it to this GPU.")
        self.methods = QtWidgets.QButtonGroup(self)
        method_row = QtWidgets.QHBoxLayout()
        for m in typing.get_args(tc.MethodConfig.model_fields["type"].annotation):
            b = QtWidgets.QRadioButton({"full": "Full fine-tune", "lora": "LoRA", "qlora": "QLoRA (4-bit)"}.get(m, m))
            b.setProperty("method", m)
            b.setToolTip(tc.MethodConfig.model_fields["type"].description)
            self.methods.addButton(b)
            method_row.addWidget(b)
        fields = tc.TrainingConfig.model_fields
        self.seq_len = _spin("data.seq_len", tc.DataConfig.model_fields["seq_len"])
        self.seq_len_error = _problem_label()
        self.batch = _spin("training.effective_batch_size", fields["effective_batch_size"])
        self.batch_error = _problem_label()
        self.length_kind = ComboBox()
        self.length_kind.addItem("steps", "steps")
        self.length_kind.addItem("epochs (passes over the data)", "epochs")
        self.length = FieldEdit(state.values["training.max_steps"])
        self.length.setToolTip(f"{fields['max_steps'].description} / {fields['epochs'].description}")
        length_row = QtWidgets.QHBoxLayout()
        length_row.addWidget(self.length, 1)
        length_row.addWidget(self.length_kind)
        self.learning_rate = FieldEdit(state.values["training.learning_rate"])
        self.learning_rate.setToolTip(fields["learning_rate"].description)
        form = QtWidgets.QFormLayout()
        form.addRow("Method", method_row)
        form.addRow("Train for", length_row)
        form.addRow("Learning rate", self.learning_rate)
        seq_row = QtWidgets.QHBoxLayout()
        seq_row.addWidget(self.seq_len, 1)
        seq_row.addWidget(self.seq_len_error, 1)
        form.addRow("Sequence length (tokens)", seq_row)
        batch_row = QtWidgets.QHBoxLayout()
        batch_row.addWidget(self.batch, 1)
        batch_row.addWidget(self.batch_error, 1)
        form.addRow("Effective batch (samples per optimizer step)", batch_row)
        self._picture_fields(state)
        form.addRow("Pictures", self.train_vision)
        form.addRow("Largest picture (pixels, width × height)", self.max_pixels)
        self.form = form
        self._show_pictures(False)
        self.verdict = QtWidgets.QLabel("Planning…")
        self.verdict.setStyleSheet("font-size: 15px; font-weight: bold")
        self.verdict.setWordWrap(True)
        self.longest = QtWidgets.QLabel()
        self.longest.setWordWrap(True)
        self.longest.setToolTip("The longest data.seq_len (multiples of 1,024 tokens) this config fits on this GPU, "
                                "with the settings the planner would choose at that length (trainpilot-cli plan "
                                "--max-seq)")
        self.longest.hide()  # shown with the first answer
        self.bar = MemoryBar()
        self.cards = CardPicker(state, only_several=True)  # the cards the plan is for (the Environment page shows the same choice)
        self.card_bars = CardBars()  # several cards: the verdict and the bar per card
        self.step_options = StepOptions(state)  # a full fine-tune's optimizer step and states (issue 39)
        self.details = QtWidgets.QLabel()
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(QtCore.Qt.TextSelectableByMouse)
        self.advanced_toggle = QtWidgets.QPushButton("Advanced settings ▸", checkable=True)
        self.advanced = SchemaForm(state.config())
        self.advanced.setVisible(False)
        self.advanced_toggle.toggled.connect(self._toggle_advanced)
        body = QtWidgets.QWidget()
        lay = QtWidgets.QVBoxLayout(body)
        for w in (self.verdict, self.cards, self.step_options, self.longest, self.picture_cost, self.bar,
                  self.card_bars, self.details,
                  self.advanced_toggle,
                  self.advanced):
            lay.addWidget(w)
        lay.addStretch(1)
        self.scroll = QtWidgets.QScrollArea(widgetResizable=True)
        self.scroll.setWidget(body)
        outer = QtWidgets.QVBoxLayout(self)
        outer.addLayout(form)
        outer.addWidget(self.scroll, 1)
        self._steps = state.values["training.max_steps"] or tc.TrainingConfig.model_fields["max_steps"].default
        self._connect()

    def _picture_fields(self, state) -> None:
        """What of the vision side trains (method.train_vision) and the largest picture (data.image_max_pixels)."""
        method = tc.MethodConfig.model_fields["train_vision"]
        self.train_vision = ComboBox()
        self.train_vision.setToolTip(method.description)
        for v in typing.get_args(method.annotation):
            self.train_vision.addItem(f"train {TRAIN_VISION_WORDS[v]}", v)
        self.max_pixels = FieldEdit(state.values["data.image_max_pixels"])
        self.max_pixels.edit.setPlaceholderText("the processor's own")
        self.max_pixels.setToolTip(tc.DataConfig.model_fields["image_max_pixels"].description)
        self.picture_cost = QtWidgets.QLabel()
        self.picture_cost.setWordWrap(True)
        self.picture_cost.setAlignment(QtCore.Qt.AlignLeft | QtCore.Qt.AlignTop)

    def _show_pictures(self, on: bool) -> None:
        for w in (self.train_vision, self.max_pixels):
            self.form.setRowVisible(w, on)
        self.picture_cost.setVisible(on)

    def _connect(self) -> None:
        self.methods.buttonToggled.connect(
            lambda b, on: on and self.state.set("method.type", b.property("method")))
        self.seq_len.valueChanged.connect(lambda v: self.state.set("data.seq_len", v))
        self.batch.valueChanged.connect(lambda v: self.state.set("training.effective_batch_size", v))
        self.advanced.changed.connect(lambda key: self.state.commit(key, self.advanced.values()[key]))
        self.learning_rate.committed.connect(lambda v: self.state.commit("training.learning_rate", v))
        self.train_vision.activated.connect(lambda _i: self.state.commit("method.train_vision",
                                                                         self.train_vision.currentData()))
        self.max_pixels.committed.connect(lambda v: self.state.commit("data.image_max_pixels", v))
        self.length.committed.connect(self._length_committed)
        self.length_kind.currentIndexChanged.connect(self._length_kind_changed)
        self.state.values_changed.connect(self._sync)
        self.state.plan_ready.connect(self.show_plan)
        self.state.longest_ready.connect(self.show_longest)
        self.state.problems.connect(self._show_problems)

    def _length_committed(self, value) -> None:
        if self.length_kind.currentData() == "epochs":
            self.state.set("training.max_steps", None)
            self.state.commit("training.epochs", value)
        else:
            self.state.commit("training.max_steps", value)

    def _length_kind_changed(self, _index: int) -> None:
        """Steps ↔ epochs: each keeps its own number (100 steps never becomes 100 epochs)."""
        if self.length_kind.currentData() == "epochs":
            self.state.update({"training.max_steps": None, "training.epochs": self.state.values["training.epochs"]})
        else:
            self.state.set("training.max_steps", self._steps)

    def initializePage(self) -> None:
        self._sync("")
        self.state.replan()

    def _toggle_advanced(self, on: bool) -> None:
        self.advanced.setVisible(on)
        self.advanced_toggle.setText("Advanced settings ▾" if on else "Advanced settings ▸")

    def _sync(self, key: str) -> None:
        """Mirror state values into the simple widgets and the form (no feedback loops)."""
        v = self.state.values
        for b in self.methods.buttons():
            if b.property("method") == v["method.type"] and not b.isChecked():
                b.setChecked(True)
        for spin, k in ((self.seq_len, "data.seq_len"), (self.batch, "training.effective_batch_size")):
            if isinstance(v[k], int) and spin.value() != v[k]:
                spin.blockSignals(True)
                spin.setValue(v[k])
                spin.blockSignals(False)
        for k in ([key] if key else list(v)):
            if k in self.advanced.editors:
                self.advanced.set_value(k, v[k])
        self.learning_rate.set_value(v["training.learning_rate"])
        self.max_pixels.set_value(v["data.image_max_pixels"])
        index = self.train_vision.findData(v["method.train_vision"])
        if index >= 0 and index != self.train_vision.currentIndex():
            self.train_vision.setCurrentIndex(index)
        if v["training.max_steps"] is not None:
            self._steps = v["training.max_steps"]  # what "steps" goes back to after a look at epochs
        by_epochs = v["training.max_steps"] is None
        self.length_kind.blockSignals(True)
        self.length_kind.setCurrentIndex(1 if by_epochs else 0)
        self.length_kind.blockSignals(False)
        self.length.set_value(v["training.epochs"] if by_epochs else v["training.max_steps"])

    def show_plan(self, plan) -> None:
        """Bind a trainer.planning.plan.Plan."""
        d = plan.to_dict()
        mv = getattr(plan, "method_verdict", None) or method_verdict(plan, self.state.snapshot())
        word = mv.words[:1].upper() + mv.words[1:]
        needs = "".join(f"<br><span style='font-weight:normal'>{user_words(r)}</span>"
                        for r in mv.reasons[:len(mv.needs)]) if mv.verdict == "needs" else ""
        self.verdict.setText(f"<span style='color:{VERDICT_COLOR.get(mv.verdict, '#333')}'>{word}</span> — predicted "
                             f"peak {gib(d.get('predicted_peak_bytes'))} of {budget_words(d)} "
                             f"<span style='font-weight:normal'>({starting_point(d)})</span>{needs}")
        self.bar.set_breakdown(d.get("breakdown") or {}, d.get("budget_bytes"))
        self.bar.setVisible(not self.card_bars.show_plan(d))  # several cards: a bar per card instead
        if not self.longest.isHidden():  # the answer for these values follows (state.longest_ready)
            self.longest.setText("Longest context with these settings: working it out…")
        cfg = plan.resolved or getattr(plan, "config_in", None)
        self.details.setText(plan_details_html(d, cfg.method.type if cfg is not None else None))
        r = plan.resolved
        running = None if r is None else ("separate" if not r.training.optimizer_in_backward else r.training.optimizer)
        self.step_options.show_options(getattr(plan, "step_options", None) or [], running)
        pictures = d.get("pictures") or {}
        self._show_pictures(bool(pictures))
        self.picture_cost.setText(picture_cost_words(pictures, (d.get("settings") or {}).get(
            "training.micro_batch_size", self.state.values.get("training.micro_batch_size"))))
        self._show_beside([])

    def show_longest(self, found) -> None:
        """Bind the longest context for the current values (``app.model.planning.longest_for``; None: hidden)."""
        self.longest.setText(longest_words(found))
        self.longest.setVisible(found is not None)

    def _show_beside(self, problems: list) -> None:
        self.advanced.show_problems(problems)
        bad = dict(problems)
        self.learning_rate.set_problem(bad.get("training.learning_rate"))
        self.length.set_problem(bad.get("training.max_steps") or bad.get("training.epochs"))
        self.max_pixels.set_problem(bad.get("data.image_max_pixels"))
        for label, key in ((self.seq_len_error, "data.seq_len"), (self.batch_error, "training.effective_batch_size")):
            label.setText(user_words(bad[key]) if bad.get(key) else "")
            label.setVisible(bool(bad.get(key)))

    def _show_problems(self, problems: list) -> None:
        self._show_beside(problems)
        if problems:
            self.bar.set_breakdown({}, None)  # the last plan is for other values: do not show it as current
            self.bar.hide()
            self.card_bars.hide()
            self.picture_cost.setText("")
            self.longest.hide()
            self.step_options.show_options([])
            self.verdict.setText("<span style='color:#d62728'>Fix these settings:</span>")
            self.details.setText("<br>".join(f"<b>{label_for(k)}</b>: {user_words(m)}" if k else user_words(m)
                                             for k, m in problems))


def plan_details_html(d: dict, method: str | None = None) -> str:
    """Settings (those that apply to a ``method`` run), reasons, apps to close and alternatives of a plan.json dict,
    as HTML."""
    parts = ["<b>Settings</b>: " + ", ".join(f"{inline_label(k)} {_cards(v, d) if k == 'distributed.gpus' else _value(v)}"
                                             for k, v in applicable(d.get("settings") or {}, method).items())]
    if d.get("host_ram_needed_bytes"):
        parts.append(f"<b>System RAM needed</b>: {gib(d['host_ram_needed_bytes'])}")
    if d.get("reasons"):
        parts.append("<b>Why</b>:<ul>" + "".join(f"<li>{user_words(r)}</li>" for r in d["reasons"]) + "</ul>")
    apps = d.get("close_apps") or [] if d.get("verdict") != "fits" else []  # nothing to close when it fits
    if apps:
        parts.append("<b>Close these apps to free VRAM</b>:<ul>" + "".join(
            f"<li>{a.get('name')} (pid {a.get('pid')}): {gib(a.get('used_memory_bytes'))}</li>" for a in apps) + "</ul>")
    alts = d.get("alternatives") or []
    if alts:
        parts.append("<b>Alternatives</b>:<ul>" + "".join(f"<li>{_alt(a)}</li>" for a in alts) + "</ul>")
    for note in d.get("notes") or []:
        parts.append(f"<i>{user_words(note)}</i>")
    return "<br>".join(parts)


def _alt(a) -> str:
    if isinstance(a, dict):
        text = a.get("description") or a.get("summary") or ", ".join(f"{k}: {v}" for k, v in a.items())
    else:
        text = str(a)
    return user_words(text)


def _cards(ids, d: dict) -> str:
    """``distributed.gpus`` as the cards it names ("GPU 1 (NVIDIA GeForce RTX 3090)"; the UUIDs are in the tooltip of
    the card picker and in Review's YAML), from the plan's ``gpus`` entries."""
    entries = {e.get("uuid"): e for e in d.get("gpus") or [] if isinstance(e, dict)}
    entries.update({e.get("index"): e for e in d.get("gpus") or [] if isinstance(e, dict)})
    if not isinstance(ids, list) or not all(i in entries for i in ids):
        return _value(ids)
    return " + ".join(f"GPU {entries[i].get('index')} ({entries[i].get('name')})" for i in ids)


def _value(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    return str(v)


def _problem_label() -> QtWidgets.QLabel:
    label = QtWidgets.QLabel()
    label.setStyleSheet("color:#c0392b")
    label.setWordWrap(True)
    label.hide()
    return label


def _spin(key: str, field) -> SpinBox:
    """A number field for ``key`` whose range is the schema's (the schema and the planner judge the value)."""
    return SpinBox(field_minimum(field), key=key, tip=field.description or "")


def budget_words(d: dict) -> str:
    """"a 22.4 GiB budget", with the card it is on where the machine has several ("a 22.4 GiB budget on GPU 1
    (NVIDIA GeForce RTX 3090)"), or per card for several ("a 10.0 GiB budget per card on 2 cards": the smallest
    card's, which binds every rank)."""
    entries = [e for e in d.get("gpus") or [] if isinstance(e, dict)]
    words = f"a {gib(d.get('budget_bytes'))} budget"
    if len(entries) == 1:
        return words + f" on GPU {entries[0].get('index')} ({entries[0].get('name')})"
    if len(entries) > 1 and all("layers" in e for e in entries):  # the layers split: the fullest card's budget
        fullest = next((e for e in entries if e.get("budget_bytes") == d.get("budget_bytes")), entries[0])
        return words + (f" on GPU {fullest.get('index')}, the fullest of {len(entries)} cards the layers are split "
                        "over")
    if len(entries) > 1:
        return words + f" per card on {len(entries)} cards"
    return words


def starting_point(d: dict) -> str:
    """Where the planner started, in words: the preset of this GPU's kind, or the CPU's."""
    form = d.get("form_factor") or ""
    if d.get("preset") == "cpu" or form == "cpu":
        return "starting point: the settings for training on the CPU"
    return f"starting point: {d.get('preset')} settings for a {form} GPU" if form else f"starting point: {d.get('preset')} settings"
