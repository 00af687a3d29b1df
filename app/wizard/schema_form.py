"""The advanced-settings form, generated from the RunConfig schema (no widget restates a default).

Every field of every section becomes a row: a check box for booleans, a combo box for Literal
choices, a line edit holding YAML for everything else (numbers, 'auto' unions, lists, null).
Initial values come from a RunConfig instance; tooltips are the schema's descriptions.
"""
from __future__ import annotations

import typing

import yaml
from pydantic import BaseModel
from PySide6 import QtCore, QtWidgets

from trainer import config as tc
from trainer.core.dotted import nested as dotted_nested


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


class SchemaForm(QtWidgets.QTabWidget):
    """One tab per config section. ``values()`` → {dotted key: value}; ``changed`` on every edit."""

    changed = QtCore.Signal()

    def __init__(self, cfg: tc.RunConfig, parent=None):
        super().__init__(parent)
        self.editors: dict[str, QtWidgets.QWidget] = {}
        self._kinds: dict[str, str] = {}
        self._add_tab("general", tc.RunConfig, top_level_fields(), cfg, "")
        for name, model in sections():
            self._add_tab(name, model, list(model.model_fields), getattr(cfg, name), f"{name}.")

    def _add_tab(self, title: str, model, names: list[str], obj, prefix: str) -> None:
        page = QtWidgets.QWidget()
        form = QtWidgets.QFormLayout(page)
        form.setFieldGrowthPolicy(QtWidgets.QFormLayout.ExpandingFieldsGrow)
        if model.__doc__:
            form.addRow(QtWidgets.QLabel(f"<i>{model.__doc__.strip().splitlines()[0]}</i>"))
        for name in names:
            f = model.model_fields[name]
            key = prefix + name
            editor = self._editor(key, f.annotation, getattr(obj, name))
            editor.setToolTip(f"{key}: {f.description or ''}")
            label = QtWidgets.QLabel(name)
            label.setToolTip(f.description or "")
            form.addRow(label, editor)
            self.editors[key] = editor
        scroll = QtWidgets.QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(page)
        self.addTab(scroll, title)

    def _editor(self, key: str, ann, value) -> QtWidgets.QWidget:
        if ann is bool:
            w = QtWidgets.QCheckBox()
            w.setChecked(bool(value))
            w.toggled.connect(self.changed)
            self._kinds[key] = "bool"
            return w
        choices = _literal_choices(ann)
        if choices is not None:
            w = QtWidgets.QComboBox()
            for c in choices:
                w.addItem(str(c), c)
            w.setCurrentIndex(choices.index(value) if value in choices else 0)
            w.currentIndexChanged.connect(self.changed)
            self._kinds[key] = "choice"
            return w
        w = QtWidgets.QLineEdit(_yaml_text(value))
        w.textEdited.connect(self.changed)
        self._kinds[key] = "yaml"
        return w

    def values(self) -> dict[str, typing.Any]:
        """Every field's current value, by dotted key (YAML text parsed; blank means null)."""
        out = {}
        for key, w in self.editors.items():
            kind = self._kinds[key]
            if kind == "bool":
                out[key] = w.isChecked()
            elif kind == "choice":
                out[key] = w.currentData()
            else:
                out[key] = parse_text(w.text())
        return out

    def set_value(self, key: str, value) -> None:
        """Show ``value`` in the editor of ``key`` (without emitting ``changed``)."""
        w = self.editors[key]
        w.blockSignals(True)
        kind = self._kinds[key]
        if kind == "bool":
            w.setChecked(bool(value))
        elif kind == "choice":
            idx = w.findData(value)
            w.setCurrentIndex(max(idx, 0))
        else:
            w.setText(_yaml_text(value))
        w.blockSignals(False)

    def show_problems(self, problems: list[tuple[str, str]]) -> None:
        """Mark the editors named in ConfigError problems (red border, message as tooltip)."""
        bad = dict(problems)
        for key, w in self.editors.items():
            w.setStyleSheet("border: 1px solid #d62728" if key in bad else "")
            if key in bad:
                w.setToolTip(f"{key}: {bad[key]}")


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
