"""The Hugging Face hub as the GUI sees it: what is in the standard cache, what a model weighs,
and shipped architectures told apart from models (light: huggingface_hub, no torch)."""
from __future__ import annotations

from pathlib import Path

from huggingface_hub import constants, try_to_load_from_cache

from trainer.core.paths import MODELS_DIR


def is_shipped_architecture(name: str | None) -> bool:
    """True for a name in trainer/resources/models/ (a config.json only: random weights, no tokenizer)."""
    return bool(name) and "/" not in name and (MODELS_DIR / f"{name}.json").is_file()


def is_cached(repo_id: str, revision: str | None = None) -> bool:
    """True when the standard HF cache holds ``repo_id``'s config.json and some weights."""
    try:
        cfg = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    except Exception:  # an id the hub would reject: certainly not cached
        return False
    if not isinstance(cfg, str):
        return False
    snapshot = Path(cfg).parent
    return any(snapshot.glob("*.safetensors")) or any(snapshot.glob("*.bin")) or \
        (snapshot / "model.safetensors.index.json").exists()


def cache_dir() -> Path:
    """The hub cache folder in use (HF_HUB_CACHE / HF_HOME aware)."""
    return Path(constants.HF_HUB_CACHE)
