"""Presets: the partial configs shipped per hardware tier (``trainer/resources/presets``)."""
from __future__ import annotations

import yaml

from trainer.core.errors import UserError
from trainer.core.paths import PRESETS_DIR


def load_preset(name: str) -> dict:
    """The partial config dict of ``trainer/resources/presets/<name>.yaml``; UserError when it is missing."""
    path = PRESETS_DIR / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))) or "none"
        raise UserError(f"unknown preset '{name}' (no {path}); available: {known}", path=str(path))
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise UserError(f"{path} must hold a mapping of config sections", path=str(path))
    return data
