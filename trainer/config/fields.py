"""Every field of the run config as ``(dotted key, type, default, description)``: what the README's config
reference (``docgen``) and the GUI's advanced form are built from. Light module.
"""
from __future__ import annotations

import re
from typing import Any

import yaml
from pydantic import BaseModel

from trainer.config.sections import RunConfig


def field_docs() -> list[tuple[str, str, str, str]]:
    """``(dotted key, type, default, description)`` for every field: the config reference."""
    rows = []

    def walk(model: type[BaseModel], prefix: str):
        for name, f in model.model_fields.items():
            ann = f.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, f"{prefix}{name}.")
                continue
            default = f.get_default(call_default_factory=True)
            rows.append((f"{prefix}{name}", _type_name(ann), yaml.safe_dump(default).strip().removesuffix("...").strip(),
                         f.description or ""))

    walk(RunConfig, "")
    return rows


def _type_name(ann: Any) -> str:
    text = str(ann).replace("typing.", "").replace("NoneType", "null")
    text = re.sub(r"<class '(\w+)'>", r"\1", text)
    text = re.sub(r"Optional\[(.*)\]", r"\1 | null", text)
    return text
