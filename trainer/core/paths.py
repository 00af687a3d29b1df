"""Where TrainPilot's shipped files live: ``trainer/resources`` (package data, so a wheel has them too)."""
from __future__ import annotations

from pathlib import Path

RESOURCES_DIR = Path(__file__).resolve().parent.parent / "resources"
MODELS_DIR = RESOURCES_DIR / "models"  # architectures (config.json files) by name
PRESETS_DIR = RESOURCES_DIR / "presets"  # partial configs per hardware tier
DEMO_CONFIG = RESOURCES_DIR / "demo.yaml"
DEMO_DATA = RESOURCES_DIR / "demo.jsonl"


def resource(name: str) -> Path:
    """A shipped file by its name relative to the resources folder."""
    return RESOURCES_DIR / name
