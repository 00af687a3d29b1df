"""Presets: the partial configs shipped per hardware tier (``configs/presets``: ``trainer.core.paths.PRESETS_DIR``)."""
from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from stat import S_ISREG
from typing import Any

import yaml

from trainer.config.messages import ConfigError
from trainer.config.loading import explicit_keys, replace, to_dict
from trainer.config.sections import RunConfig
from trainer.core.dotted import flatten, get_in
from trainer.core.errors import UserError
from trainer.core.paths import PRESETS_DIR


def load_preset(name: str) -> dict:
    """The partial config dict of ``configs/presets/<name>.yaml`` (a fresh copy); UserError when it is missing."""
    path = PRESETS_DIR / f"{name}.yaml"
    try:
        stat = path.stat()
    except OSError:
        stat = None
    if stat is None or not S_ISREG(stat.st_mode):
        known = ", ".join(sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))) or "none"
        raise UserError(f"unknown preset '{name}' (no {path}); available: {known}", path=str(path))
    return copy.deepcopy(_parsed(str(path), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=32)
def _parsed(path: str, _mtime_ns: int, _size: int) -> dict:
    """The preset file parsed once per version of it: every plan reads its tier's preset (the picker's verdicts
    made ~200 plans, each parsing the YAML again: a tenth of their time)."""
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise UserError(f"{path} must hold a mapping of config sections", path=path)
    return data


# A preset is a hardware tier's *machine* settings. The training recipe (model, data, sequence
# length, effective batch, learning rate, steps) is the user's and is never changed by the machine a
# config runs on, so a config reruns the same training anywhere; a preset file's recipe values are
# used only when that file itself is run as a config.
MACHINE_SECTIONS = ("speed", "deepspeed", "checkpoints")
MACHINE_KEYS = ("device", "training.micro_batch_size", "training.gradient_accumulation_steps")


def is_machine_key(key: str) -> bool:
    """Whether a dotted key is a machine setting a preset may supply."""
    return key in MACHINE_KEYS or key.split(".")[0] in MACHINE_SECTIONS


def machine_values(name: str) -> dict[str, Any]:
    """The preset's machine settings as dotted keys (``{"speed.gradient_checkpointing": True, ...}``)."""
    return {k: v for k, v in flatten(load_preset(name)).items() if is_machine_key(k)}


# The preset's values for these are where the planner starts; it chooses them (they are "auto" to it).
PLANNER_CHOICES = ("training.micro_batch_size", "training.gradient_accumulation_steps",
                   "speed.gradient_checkpointing", "deepspeed.enabled")


def layer(cfg: RunConfig, name: str) -> tuple[RunConfig, dict[str, Any]]:
    """The preset as the base layer under ``cfg``: every machine setting the user did not set comes
    from the preset (the user's values win). ``PLANNER_CHOICES`` the user left unset are layered as
    "auto": the preset's value is where the planner starts and what its report compares with.
    Returns the layered config and the preset values that were layered (see ``layer_with_rulings``)."""
    layered, applied, _ = layer_with_rulings(cfg, name)
    return layered, applied


def layer_with_rulings(cfg: RunConfig, name: str) -> tuple[RunConfig, dict[str, Any], dict[str, str]]:
    """``layer``, and which preset values the user's explicit settings rule out: a preset value that
    would contradict one of yours is never layered (your ``deepspeed.enabled: false`` rules out the
    preset's optimizer offload). Returns (layered config, preset values layered, ruled-out key → the
    settings of yours that rule it out, e.g. 'deepspeed.enabled: false')."""
    mine, current = explicit_keys(cfg), to_dict(cfg)
    out, applied, ruled = cfg, {}, {}
    values = machine_values(name)
    for key in sorted(values, key=lambda k: k not in PLANNER_CHOICES):  # "deepspeed.enabled: auto" before offload
        value = values[key]
        if key in mine:
            continue
        wanted = "auto" if key in PLANNER_CHOICES else value
        if get_in(current, key) != wanted:
            try:
                out = replace(out, **{key: wanted})
            except ConfigError as exc:  # it contradicts a value of yours: yours win, the preset's is dropped
                ruled[key] = ", ".join(f"{f}: {json.dumps(get_in(current, f))}" for f, _ in exc.problems
                                       if f in mine) or "; ".join(m for _, m in exc.problems)
                continue
        applied[key] = value
    return out, applied, ruled
