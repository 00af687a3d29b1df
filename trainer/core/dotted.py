"""Dotted keys (``"training.micro_batch_size"``) over nested dicts: the one walker that the config's
``--set`` overrides, ``replace``, presets, the planner's settings and the GUI form all use."""
from __future__ import annotations

from typing import Any

def set_in(data: dict, key: str, value: Any) -> dict:
    """Set ``data[a][b] = value`` for ``key`` "a.b" in place (creating or replacing inner mappings); returns data."""
    *head, last = key.split(".")
    node = data
    for k in head:
        if not isinstance(node.get(k), dict):
            node[k] = {}
        node = node[k]
    node[last] = value
    return data


def get_in(data: dict, key: str, default: Any = None) -> Any:
    """``data[a][b]`` for ``key`` "a.b", or ``default`` when any part is missing."""
    node: Any = data
    for k in key.split("."):
        if not isinstance(node, dict) or k not in node:
            return default
        node = node[k]
    return node


def nested(flat: dict[str, Any]) -> dict:
    """``{"a.b": 1}`` → ``{"a": {"b": 1}}``."""
    out: dict = {}
    for key, value in flat.items():
        set_in(out, key, value)
    return out


def flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}`` (lists and other values are leaves)."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out
