"""Reading a run config: YAML files, ``--set key.path=value`` overrides, validation (every problem at once,
secrets refused and never echoed), copies with changes, and which keys the user set. Light module:
pydantic and PyYAML only (the GUI imports it).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from trainer.config.cross_checks import CrossCheckError
from trainer.config.messages import ConfigError, dedupe_union, fix_for
from trainer.config.sections import RunConfig
from trainer.core.dotted import flatten, set_in
from trainer.core.secrets import TOKEN_PATTERN, redact, secret_values


def validate(data: Any, source: str | None = None) -> RunConfig:
    """Build a RunConfig from plain data; raise ConfigError listing every problem at once."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([("", f"the config must be a YAML mapping of sections, not {type(data).__name__}")], source)
    data = _drop_legacy_keys(data)
    model = data.get("model")
    extra = model.get("hub_token_env") if isinstance(model, dict) else None
    known = _secret_env_values((extra,) if isinstance(extra, str) else ())
    tokens = find_tokens(data, known)
    problems = [(path, "looks like a secret token; never put tokens in a config: set the "
                 "HF_TOKEN environment variable (or model.hub_token_env) instead")
                for path, _ in tokens]
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as exc:
        for e in dedupe_union(exc.errors(include_url=False)):
            ctx_err = (e.get("ctx") or {}).get("error")
            if isinstance(ctx_err, CrossCheckError):
                problems += ctx_err.problems
                continue
            problems.append((".".join(e["loc"]), fix_for(e)))
        # messages echo the offending input ("got '...'"): a token put in the wrong field must not be echoed
        hidden = [v for _, v in tokens] + known
        raise ConfigError([(loc, redact(msg, hidden)) for loc, msg in problems], source) from None
    if problems:
        raise ConfigError(problems, source)
    cfg._explicit = frozenset(flatten(data))
    return cfg


LEGACY_KEYS = (("distributed", "backend"),)  # read by no code; accepted (and dropped) so old run folders resume
# Renamed keys, read as their new spelling so old configs and run folders keep their meaning:
# (section, old key, new key, {old value: new value}). A config that sets both keeps the new one unless it is "auto".
RENAMED_KEYS = (("speed", "chunked_loss", "loss_kernel", {True: "chunked", False: "hf", "auto": "auto"}),)


def _drop_legacy_keys(data: dict) -> dict:
    out = dict(data)
    for section, key in LEGACY_KEYS:
        if isinstance(out.get(section), dict) and key in out[section]:
            out[section] = {k: v for k, v in out[section].items() if k != key}
    for section, old, new, values in RENAMED_KEYS:
        part = out.get(section)
        if isinstance(part, dict) and old in part:
            part = {k: v for k, v in part.items() if k != old}
            value = data[section][old]
            # a value the old key never took is left for validation to name (under the new key)
            if part.get(new, "auto") == "auto":
                part[new] = values.get(value, value) if isinstance(value, (bool, str)) else value
            out[section] = part
        out = _rename_kept(out, f"{section}.{old}", f"{section}.{new}")
    return out


def _rename_kept(data: dict, old: str, new: str) -> dict:
    """``recovery.ladder_keeps`` written before a rename names the old key: read as the new one."""
    recovery = data.get("recovery")
    keep = recovery.get("ladder_keeps") if isinstance(recovery, dict) else None
    if not isinstance(keep, list) or old not in keep:
        return data
    kept = list(dict.fromkeys(new if k == old else k for k in keep))
    return dict(data, recovery=dict(recovery, ladder_keeps=kept))


def _secret_env_values(extra_names: tuple[str, ...] = ()) -> list[str]:
    """Secret values in the environment, longest first (``trainer.core.secrets``' one rule; no keyring
    lookup here). ``extra_names``: more variables holding secrets (the config's ``model.hub_token_env``)."""
    return secret_values(extra_names, keyring=False)


def find_tokens(data: Any, known: list[str] = (), path: str = "") -> list[tuple[str, str]]:
    """``(field path, value)`` of strings that are token-shaped or contain a secret from the environment."""
    found = []
    if isinstance(data, dict):
        for k, v in data.items():
            found += find_tokens(v, known, f"{path}.{k}" if path else str(k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            found += find_tokens(v, known, f"{path}[{i}]")
    elif isinstance(data, str) and (TOKEN_PATTERN.search(data) or any(v in data for v in known)):
        found.append((path, data))
    return found


def read_yaml(path: str | Path) -> dict:
    """Read a YAML mapping from a file; ConfigError (naming the file and line) when it cannot be read."""
    p = Path(path)
    if not p.exists():
        raise ConfigError([("", f"config file not found: {p}; check the path")])
    if p.is_dir():
        raise ConfigError([("", f"{p} is a folder; pass the config .yaml file (a run folder holds config.yaml)")])
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError([("", f"{p} is not UTF-8 text; save the config as UTF-8")]) from None
    except OSError as exc:
        raise ConfigError([("", f"cannot read {p}: {exc.strerror}; check its permissions")]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "malformed YAML"
        raise ConfigError([("", f"{p}: YAML syntax error{where}: {problem}; fix the indentation or quoting there")]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([("", f"{p} must hold a YAML mapping of sections (model:, data:, training: ...)")])
    return data


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse ``key.path=value`` (value is YAML: numbers, true/false, null, lists)."""
    if "=" not in item:
        raise ConfigError([("--set", f"'{item}' is not key.path=value (e.g. training.learning_rate=1e-4)")])
    key, raw = item.split("=", 1)
    keys = [k for k in key.strip().split(".") if k]
    if not keys:
        raise ConfigError([("--set", f"'{item}' has no key before '='")])
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return keys, value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Return a copy of ``data`` with dotted overrides applied (unknown keys caught by validate)."""
    import copy

    out = copy.deepcopy(data)
    for item in overrides or []:
        keys, value = parse_override(item)
        set_in(out, ".".join(keys), value)
    return out


def load(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Load a config file, apply ``--set`` overrides, validate. Raises ConfigError."""
    data = apply_overrides(read_yaml(path), overrides or [])
    return validate(data, source=str(path))


def to_dict(cfg: RunConfig) -> dict:
    """Plain data, every field present (so the dump is complete and round-trips exactly)."""
    return cfg.model_dump(mode="json")


def dump_yaml(cfg: RunConfig) -> str:
    """The resolved config as YAML text (sections in schema order)."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=False, allow_unicode=True)


def replace(cfg: RunConfig, **dotted: Any) -> RunConfig:
    """A validated copy with dotted changes, e.g. ``replace(cfg, **{"training.micro_batch_size": 2})``.
    The copy remembers which keys the user set (``explicit_keys``); the changed keys are not added."""
    data = to_dict(cfg)
    for key, value in dotted.items():
        set_in(data, key, value)
    out = validate(data)
    out._explicit = cfg._explicit
    return out


def explicit_keys(cfg: RunConfig) -> frozenset[str]:
    """Dotted keys the user's config (file, ``--set``, GUI) set itself; everything else is a default."""
    return cfg._explicit
