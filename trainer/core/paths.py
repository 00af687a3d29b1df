"""Where TrainPilot's shipped files live: ``trainer/resources`` (package data, so a wheel has them too)."""
from __future__ import annotations

import os
from pathlib import Path

RESOURCES_DIR = Path(__file__).resolve().parent.parent / "resources"
MODELS_DIR = RESOURCES_DIR / "models"  # architectures (config.json files) by name
STRUCTURES_DIR = MODELS_DIR / "structures"  # their structure records (trainer/models/structure.py), by config hash
PROCESSORS_DIR = MODELS_DIR / "processors"  # vision-language models' published image-processor settings, by name
PRESETS_DIR = RESOURCES_DIR / "presets"  # partial configs per hardware tier
DEMO_CONFIG = RESOURCES_DIR / "demo.yaml"
DEMO_DATA = RESOURCES_DIR / "demo.jsonl"


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache folder by huggingface_hub's own rule, read now (not at import):
    ``HF_HUB_CACHE``, else the older ``HUGGINGFACE_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``. The one home of that rule
    (the model spec lookup and the GUI's hub page ask it)."""
    env = os.environ
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface")
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(cache)))


def hf_repo_cache(repo_id: str) -> Path:
    """The hub cache's folder of the model ``repo_id`` (huggingface_hub's layout: ``<hub cache>/models--org--name``,
    with ``snapshots/<revision>/`` and ``blobs/`` inside). The one home of that layout."""
    return hf_hub_cache() / ("models--" + repo_id.strip().replace("/", "--"))


def cache_dir() -> Path:
    """TrainPilot's cache folder, read now: ``TRAINPILOT_CACHE``, else ``~/.cache/trainpilot``. The one home of
    that rule (tokenizers, data blocks and scans, model structure records)."""
    return Path(os.environ.get("TRAINPILOT_CACHE") or Path.home() / ".cache" / "trainpilot")
