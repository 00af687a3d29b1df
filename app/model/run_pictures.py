"""Whether a run's model takes pictures (Try it offers a picture only then). Light: reads JSON files, no torch."""
from __future__ import annotations

from pathlib import Path

from trainer import config as tc
from trainer.models import vision
from trainer.models.spec import find_config
from trainer.rundir.runstate import trained_model


def takes_pictures(run_dir: str | Path) -> bool:
    """True when the run trains a vision-language model: its trained model's folder holds a config.json with a vision
    tower (a full or merged model), else the base model's config.json says so (a LoRA adapter's run)."""
    run = Path(run_dir)
    model = trained_model(run)
    if model is not None and (model.path / "config.json").is_file():
        return vision.is_vision_language(vision.read_json(model.path / "config.json"))
    try:
        cfg = tc.load(run / "config.yaml")
    except (tc.ConfigError, OSError, ValueError):
        return False
    found = find_config(cfg.model.architecture or cfg.model.source)
    return found is not None and vision.is_vision_language(vision.read_json(found))
