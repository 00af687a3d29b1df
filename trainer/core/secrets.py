"""Tokens come from the environment or the OS keyring, and never reach a file.

``redact`` replaces every known secret value (and anything shaped like a hub/API token) in text
before it is written to events, logs or exports.
"""
from __future__ import annotations

import os
import re

# Variables whose values are secrets wherever they appear.
SECRET_ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_TOKEN", "WANDB_API_KEY",
                   "HF_HUB_TOKEN", "COMET_API_KEY", "NEPTUNE_API_TOKEN", "MLFLOW_TRACKING_TOKEN",
                   "MLFLOW_TRACKING_PASSWORD")
# The one token pattern: config validation and redaction both use it.
TOKEN_PATTERN = re.compile(r"\b(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|ghp_[A-Za-z0-9]{20,}|"
                           r"github_pat_[A-Za-z0-9_]{20,})\b")
REDACTED = "***"


def _keyring_token(name: str) -> str | None:
    try:
        import keyring
    except ImportError:
        return None
    try:
        return keyring.get_password("trainpilot", name)
    except Exception:  # no backend on this machine: keyring raises its own error types
        return None


def hub_token(cfg=None) -> str | None:
    """The hub token: from ``model.hub_token_env`` (default HF_TOKEN), else the keyring; None if absent."""
    name = cfg.model.hub_token_env if cfg is not None else "HF_TOKEN"
    return os.environ.get(name) or _keyring_token(name)


_SECRET_NAME = re.compile(r"(TOKEN|API_KEY|SECRET|PASSWORD|WEBHOOK|WEBHOOK_URL)$")


def is_secret_name(name: str) -> bool:
    """The one rule for which environment variables hold secrets: the known ones (SECRET_ENV_VARS) and
    any variable named like one (``*_TOKEN``, ``*_API_KEY``, ``*_SECRET``, ``*_PASSWORD``, ``*_WEBHOOK_URL``)."""
    return name in SECRET_ENV_VARS or bool(_SECRET_NAME.search(name.upper()))


def secret_values(extra_env: tuple[str, ...] = (), keyring: bool = True) -> list[str]:
    """Secret values currently known, longest first: every environment variable ``is_secret_name`` says
    holds one, the ``extra_env`` names (e.g. ``model.hub_token_env``), and the keyring's hub token unless
    ``keyring`` is False (config validation skips the keyring: a lookup can take a second)."""
    names = set(SECRET_ENV_VARS + tuple(extra_env)) | {n for n in os.environ if is_secret_name(n)}
    values = {os.environ.get(n) for n in names}
    if keyring:
        values.add(_keyring_token("HF_TOKEN"))
    return sorted((v for v in values if v and len(v) >= 8), key=len, reverse=True)


def named_secret(name: str) -> str | None:
    """The secret held by environment variable ``name``, else by the keyring entry 'trainpilot/<name>'; None if absent."""
    return os.environ.get(name) or _keyring_token(name)


def redact(text: str, values: list[str] | None = None) -> str:
    """``text`` with every secret value and token-shaped string replaced by ``***`` (the longest values first: a
    value inside another leaves none of the longer one behind)."""
    for v in sorted({v for v in (values if values is not None else secret_values()) if v}, key=len, reverse=True):
        text = text.replace(v, REDACTED)
    return TOKEN_PATTERN.sub(REDACTED, text)
