"""The advanced-settings form, generated from the RunConfig schema (no widget restates a default).

Every field of every section becomes a row in that section's group: a check box for booleans, a
combo box for Literal choices, a ``FieldEdit`` holding YAML for everything else (numbers, 'auto'
unions, lists, null). Initial values come from a RunConfig instance; tooltips are the schema's
descriptions. Internal fields (``schema_version``) are shown, not editable.

Text fields never rewrite what is being typed: a value is taken when the field is left or Enter is
pressed, a problem is shown beside the field, and the text stays as typed.
"""
from __future__ import annotations

import re
import typing

import yaml
from pydantic import BaseModel
from PySide6 import QtCore, QtWidgets

from trainer import config as tc
from app.views.wheel_guard import ComboBox
from trainer.core.dotted import nested as dotted_nested

READ_ONLY = ("schema_version",)  # internal: the file format, not a setting


def _literal_choices(ann) -> list | None:
    """Choices of a pure Literal annotation (``Literal['a', 'b']``), else None."""
    if typing.get_origin(ann) is typing.Literal:
        return list(typing.get_args(ann))
    return None


def sections() -> list[tuple[str, type[BaseModel]]]:
    """(name, model) of each config section, in schema order."""
    out = []
    for name, f in tc.RunConfig.model_fields.items():
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
            out.append((name, f.annotation))
    return out


def top_level_fields() -> list[str]:
    """Top-level scalar fields (name, device, ...)."""
    return [n for n, f in tc.RunConfig.model_fields.items()
            if not (isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel))]


# Where the field's own name is not a word, or not enough of one.
WORDS = {"data.seq_len": "sequence length", "method.type": "method", "deepspeed.enabled": "DeepSpeed"}


def label_for(key: str) -> str:
    """A dotted key in the user's words: 'training.micro_batch_size' → 'Micro batch size'."""
    words = WORDS.get(key) or key.rsplit(".", 1)[-1].replace("_", " ")
    if key in WORDS:
        return words[:1].upper() + words[1:] if words.islower() else words
    return words[:1].upper() + words[1:]


def inline_label(key: str) -> str:
    """A dotted key in the middle of a sentence: 'micro batch size', 'DeepSpeed'."""
    word = WORDS.get(key)
    return word if word and not word.islower() else label_for(key).lower()


_DOTTED = re.compile(r"\b(?:" + "|".join(sorted((re.escape(k) for k, *_ in tc.field_docs() if "." in k),
                                                   key=len, reverse=True)) + r")\b")
_GB = re.compile(r"(\d(?:[\d.,]*\d)?) ?GB\b")


def user_words(text: str) -> str:
    """Planner text for people: dotted config keys become words ('training.micro_batch_size' →
    'micro batch size') and every memory figure reads GiB (the planner computes in 2**30 bytes)."""
    text = _DOTTED.sub(lambda m: inline_label(m.group(0)), str(text))
    return _GB.sub(lambda m: f"{m.group(1)} GiB", text)


class _LineEdit(QtWidgets.QLineEdit):
    """Enter takes the value and stops there (a dialog's default button must not fire on it)."""

    def keyPressEvent(self, event) -> None:
        super().keyPressEvent(event)
        if event.key() in (QtCore.Qt.Key_Return, QtCore.Qt.Key_Enter):
            event.accept()


class FieldEdit(QtWidgets.QWidget):
    """A line edit with its problem shown beside it. ``committed(value)`` when left or on Enter
    (when the user typed in it since the last commit, even the same text again: a value typed is the
    user's); never rewrites the text while focused."""

    committed = QtCore.Signal(object)

    def __init__(self, value=None, parent=None):
        super().__init__(parent)
        self.edit = _LineEdit(_yaml_text(value))
        self.error = QtWidgets.QLabel()
        self.error.setStyleSheet("color:#c0392b")
        self.error.setWordWrap(True)
        self.error.hide()
        lay = QtWidgets.QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.edit, 1)
        lay.addWidget(self.error, 1)
        self._last = self.edit.text()
        self._typed = False  # the user edited the text since the last commit (textEdited: never programmatic)
        self.edit.textEdited.connect(lambda _t: setattr(self, "_typed", True))
        self.edit.editingFinished.connect(self._finish)

    def text(self) -> str:
        """The text as typed."""
        return self.edit.text()

    def value(self):
        """The typed text parsed as YAML (blank: null)."""
        return parse_text(self.edit.text())

    def set_value(self, value) -> None:
        """Show ``value`` unless the field is being edited or already shows an equal value."""
        if self.edit.hasFocus() or (self.edit.text().strip() and self.value() == value):
            return
        self.edit.setText(_yaml_text(value))
        self._last = self.edit.text()

    def set_problem(self, message: str | None) -> None:
        """Show ``message`` beside the field (None clears it); the text is left as typed."""
        self.error.setText(message or "")
        self.error.setVisible(bool(message))
        self.edit.setStyleSheet("border: 1px solid #d62728" if message else "")

    def _finish(self) -> None:
        if self.edit.text() != self._last or self._typed:
            self._last, self._typed = self.edit.text(), False
            self.committed.emit(self.value())


class SchemaForm(QtWidgets.QWidget):
    """One group per config section, stacked (room to read). ``values()`` → {dotted key: value};
    ``changed(key)`` when the user commits a field."""

    changed = QtCore.Signal(str)

    def __init__(self, cfg: tc.RunConfig, parent=None):
        super().__init__(parent)
        self.editors: dict[str, QtWidgets.QWidget] = {}
        self._errors: dict[str, QtWidgets.QLabel] = {}  # the problem beside a check box or combo box
        self._kinds: dict[str, str] = {}
        self.groups: dict[str, QtWidgets.QGroupBox] = {}
        self._lay = QtWidgets.QVBoxLayout(self)
        self._lay.setContentsMargins(0, 0, 0, 0)
        self._add_group("general", tc.RunConfig, top_level_fields(), cfg, "")
        for name, model in sections():
            self._add_group(name, model, list(model.model_fields), getattr(cfg, name), f"{name}.")

    def _add_group(self, title: str, model, names: list[str], obj, prefix: str) -> None:
        box = QtWidgets.QGroupBox(title.capitalize())
        form = QtWidgets.QFormLayout(box)
        form.setFieldGrowthPolicy(QtWidgets.QFormLayout.ExpandingFieldsGrow)
        form.setRowWrapPolicy(QtWidgets.QFormLayout.WrapLongRows)
        if model.__doc__:
            note = QtWidgets.QLabel(f"<i>{model.__doc__.strip().splitlines()[0]}</i>")
            note.setWordWrap(True)
            form.addRow(note)
        for name in names:
            f = model.model_fields[name]
            key = prefix + name
            label = QtWidgets.QLabel(label_for(key))
            label.setToolTip(f"{key}: {f.description or ''}")
            if name in READ_ONLY and not prefix:
                shown = QtWidgets.QLabel(f"{getattr(obj, name)} (set by TrainPilot)")
                form.addRow(label, shown)
                continue
            editor = self._editor(key, f.annotation, getattr(obj, name))
            editor.setToolTip(f"{key}: {f.description or ''}")
            form.addRow(label, editor if isinstance(editor, FieldEdit) else self._beside(key, editor))
            self.editors[key] = editor
        self._lay.addWidget(box)
        self.groups[title] = box

    def _beside(self, key: str, editor: QtWidgets.QWidget) -> QtWidgets.QWidget:
        """A check box or combo box with its problem in words beside it (a red border from a style sheet shrank a
        combo box to "c…a": its size hint no longer holds the text)."""
        row = QtWidgets.QWidget()
        lay = QtWidgets.QHBoxLayout(row)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(editor)
        error = self._errors[key] = QtWidgets.QLabel()
        error.setStyleSheet("color:#c0392b")
        error.setWordWrap(True)
        error.hide()
        lay.addWidget(error, 1)
        return row

    def _editor(self, key: str, ann, value) -> QtWidgets.QWidget:
        if ann is bool:
            w = QtWidgets.QCheckBox()
            w.setChecked(bool(value))
            w.toggled.connect(lambda _on, key=key: self.changed.emit(key))
            self._kinds[key] = "bool"
            return w
        choices = _literal_choices(ann)
        if choices is not None:
            w = ComboBox()
            for c in choices:
                w.addItem(str(c), c)
            w.setCurrentIndex(choices.index(value) if value in choices else 0)
            w.currentIndexChanged.connect(lambda _i, key=key: self.changed.emit(key))
            self._kinds[key] = "choice"
            return w
        w = FieldEdit(value)
        w.committed.connect(lambda _v, key=key: self.changed.emit(key))
        self._kinds[key] = "yaml"
        return w

    def values(self) -> dict[str, typing.Any]:
        """Every editable field's current value, by dotted key (YAML text parsed; blank means null)."""
        out = {}
        for key, w in self.editors.items():
            kind = self._kinds[key]
            if kind == "bool":
                out[key] = w.isChecked()
            elif kind == "choice":
                out[key] = w.currentData()
            else:
                out[key] = w.value()
        return out

    def set_value(self, key: str, value) -> None:
        """Show ``value`` in the editor of ``key`` (without emitting ``changed``; a text field being
        edited is left alone)."""
        w = self.editors[key]
        w.blockSignals(True)
        kind = self._kinds[key]
        if kind == "bool":
            w.setChecked(bool(value))
        elif kind == "choice":
            idx = w.findData(value)
            w.setCurrentIndex(max(idx, 0))
        else:
            w.set_value(value)
        w.blockSignals(False)

    def show_problems(self, problems: list[tuple[str, str]]) -> None:
        """Show each ConfigError problem beside its field; clear the others."""
        bad = dict(problems)
        for key, w in self.editors.items():
            if isinstance(w, FieldEdit):
                w.set_problem(bad.get(key))
            else:
                self._errors[key].setText(user_words(bad[key]) if key in bad else "")
                self._errors[key].setVisible(key in bad)


def parse_text(text: str):
    """A line edit's YAML value; blank is null, and '1e-4' is a number (YAML 1.1 reads it as text)."""
    text = text.strip()
    if not text:
        return None
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                pass
    return value


def _yaml_text(value) -> str:
    if value is None:
        return ""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def nested(dotted: dict[str, typing.Any]) -> dict:
    """{'a.b': 1} → {'a': {'b': 1}} (the shape ``trainer.config.validate`` takes)."""
    return dotted_nested(dotted)
