"""A model's position limit: the one reader the wizard, Start (preflight) and the export ask (docs/design.md, "One home
per rule"). Light: JSON only, no torch.

What a config states, read as transformers builds the model: the text model's own config (a vision-language
checkpoint's ``text_config``; a text model's config itself) holds ``max_position_embeddings``, or ``n_positions``
(GPT-2, T5). A composite checkpoint's top-level key is not what its text model reads, so it is not read. A config that
states neither has no known limit (None): nothing is refused for it.

Before this module three readers disagreed: the wizard took the structure record's number (transformers' class
default where the config states none), Start read the top level of a composite config over its text model's, and the
export fell back on 2,048.
"""
from __future__ import annotations

import json
from typing import Optional

from trainer.models.spec import find_config

KEYS = ("max_position_embeddings", "n_positions")


def position_limit(config) -> Optional[int]:
    """The most positions (tokens) the model of ``config`` reads, or None when the config states none. ``config``: a
    config.json dict, or a transformers config (read as its ``to_dict()``)."""
    if not isinstance(config, dict):
        config = config.to_dict() if hasattr(config, "to_dict") else {}
    text = config.get("text_config")
    text = text if isinstance(text, dict) else config
    for key in KEYS:
        value = text.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def model_config(source_or_arch: str) -> Optional[dict]:
    """The config.json dict of a model source or shipped architecture (the file the planner's spec reads:
    ``spec.find_config``), or None when none is on this computer or it is not a JSON object."""
    path = find_config(source_or_arch)
    if path is None:
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def run_position_limit(cfg) -> Optional[int]:
    """The position limit (tokens) of a RunConfig's model (``model.architecture`` when set, else ``model.source``),
    None when unknown: no config.json here yet, or one that states none."""
    config = model_config(cfg.model.architecture or cfg.model.source)
    return position_limit(config) if config is not None else None
