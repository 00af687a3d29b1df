"""Where TrainPilot's shipped files live. ``trainer/resources``: package data the code reads (architectures,
structure records, processor settings, the demo data). ``configs/`` at the top of the repository: the configs a
user copies and edits (the tier presets, the demo config); a wheel carries them as ``trainer/configs``
(``setup.py`` maps the folder into the package), so an installed TrainPilot finds them there and a checkout
finds them beside ``trainer/``."""
from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent.parent
RESOURCES_DIR = _PACKAGE / "resources"
MODELS_DIR = RESOURCES_DIR / "models"  # architectures (config.json files) by name
STRUCTURES_DIR = MODELS_DIR / "structures"  # their structure records (trainer/models/structure.py), by config hash
PROCESSORS_DIR = MODELS_DIR / "processors"  # vision-language models' published image-processor settings, by name
DEMO_DATA = RESOURCES_DIR / "demo.jsonl"
# Installed from a wheel: trainer/configs; a checkout or an editable install: configs/ beside trainer/.
CONFIGS_DIR = _PACKAGE / "configs" if (_PACKAGE / "configs").is_dir() else _PACKAGE.parent / "configs"
PRESETS_DIR = CONFIGS_DIR / "presets"  # partial configs per hardware tier
DEMO_CONFIG = CONFIGS_DIR / "demo.yaml"


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
