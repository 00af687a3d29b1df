"""Where a run's model and tokenizer come from, checked cheaply (no torch): shipped architectures,
local folders, hub ids. The worker loads them; preflight and the GUI check them."""
from __future__ import annotations

import os
from pathlib import Path

from trainer.core.errors import UserError
from trainer.core.paths import MODELS_DIR, hf_repo_cache

DEMO_MODEL = "demo-tiny-llama"


_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def architecture_file(name: str) -> Path:
    """Path of an architecture: a config.json path, or a name in trainer/resources/models/ (UserError if neither)."""
    p = Path(name).expanduser()
    if p.is_file():
        return p
    if p.is_dir() and (p / "config.json").is_file():
        return p / "config.json"
    shipped = MODELS_DIR / f"{name}.json"
    if shipped.is_file():
        return shipped
    names = sorted(f.stem for f in MODELS_DIR.glob("*.json"))
    raise UserError(f"model.architecture: '{name}' is neither a config.json file nor a shipped architecture; "
                    f"use one of: {', '.join(names)}", field="model.architecture")


def built_here(model) -> bool:
    """True for weights no hub or cache file describes: the shipped demo model, or random weights built from
    ``model.architecture`` (``model`` is a config's ``model`` section). Nothing is asked of the hub about them — no
    processor, no generation config — so no run of them waits on a network. The one home of that rule."""
    return not model.source or model.source in ("demo", DEMO_MODEL) or bool(model.architecture)


def is_local(source: str) -> bool:
    """True when ``source`` looks like a path rather than a hub id."""
    return source.startswith((".", "/", "~", "\\")) or os.path.isabs(source) or Path(source).expanduser().exists() \
        or (len(source) > 1 and source[1] == ":")


def check_model_source(cfg) -> None:
    """Cheap checks of the model folder (no torch): exists, readable, has config.json and weights."""
    m = cfg.model
    if m.architecture or m.source == DEMO_MODEL:
        if m.architecture:
            architecture_file(m.architecture)
        return
    if not is_local(m.source):
        return  # a hub id: checked when downloading
    p = Path(m.source).expanduser()
    if not p.exists():
        raise UserError(f"model.source: model folder not found: {p}; check the path or use a hub id like "
                        f"meta-llama/Llama-3.2-1B", field="model.source", path=str(p))
    if not p.is_dir() or not os.access(p, os.R_OK | os.X_OK):
        raise UserError(f"model.source: cannot read the model folder {p}; check that it is a folder you may read",
                        field="model.source", path=str(p))
    if not (p / "config.json").is_file():
        raise UserError(f"model.source: {p} has no config.json; point it at the folder that holds config.json "
                        f"and the weights", field="model.source", path=str(p))
    if not any((p / f).is_file() for f in _WEIGHT_FILES) and not m.architecture:
        raise UserError(f"model.source: {p} has config.json but no weights (model.safetensors); copy the weights "
                        f"there, or set model.architecture to train from random weights", field="model.source", path=str(p))


def check_tokenizer_source(cfg) -> None:
    """Cheap check that a local tokenizer folder has tokenizer files."""
    src = tokenizer_source(cfg)
    if src in ("demo", "corpus", None) or not is_local(src):
        return
    p = Path(src).expanduser()
    if not p.is_dir() or not any((p / f).is_file() for f in _TOKENIZER_FILES):
        key = "model.tokenizer" if cfg.model.tokenizer else "model.source"
        raise UserError(f"{key}: no tokenizer in {p} (tokenizer.json or tokenizer.model); copy the tokenizer files "
                        f"there or set model.tokenizer to a folder or hub id that has them", field=key, path=str(p))


def tokenizer_source(cfg) -> str | None:
    """Where the tokenizer comes from: model.tokenizer, else the source ('demo' for the demo model)."""
    m = cfg.model
    if m.tokenizer:
        return m.tokenizer
    if m.source == DEMO_MODEL or (m.architecture and m.source == DEMO_MODEL):
        return "demo"
    return m.source


def tokenizer_cached(repo_id: str) -> bool:
    """True when the Hugging Face cache holds tokenizer files of the hub model ``repo_id`` (no network)."""
    snapshots = hf_repo_cache(repo_id) / "snapshots"
    return any(next(snapshots.glob(f"*/{name}"), None) is not None for name in _TOKENIZER_FILES)


# config.json keys that count a mixture of experts' routed experts (Qwen-MoE, Mixtral/gpt-oss/Phi-MoE/Granite-MoE,
# DeepSeek, ERNIE), at the top or in a multimodal checkpoint's text_config
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def routed_experts(conf: dict) -> int | None:
    """How many routed experts per layer an HF ``config.json`` (as a dict) declares; None for a dense model."""
    for section in (conf, conf.get("text_config") or {}):
        for key in EXPERT_KEYS:
            value = section.get(key)
            if isinstance(value, int) and value > 1:
                return value
    return None
