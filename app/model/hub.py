"""The Hugging Face hub as the GUI sees it: what is in the standard cache, what a model weighs,
and shipped architectures told apart from models (light: huggingface_hub, no torch)."""
from __future__ import annotations

import socket
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from huggingface_hub import constants, try_to_load_from_cache

from trainer.core.paths import MODELS_DIR, hf_hub_cache


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


REACH_TIMEOUT_S = 4.0  # one connection attempt (seconds); huggingface_hub's own retries take ~25 s


class HubOffline(OSError):
    """The hub cannot be reached from here: the message says so in words (never a socket error)."""


def offline_reason(timeout_s: float = REACH_TIMEOUT_S) -> str | None:
    """Why the hub (``HF_ENDPOINT``) cannot be reached now, in words, or None when it accepts a
    connection within ``timeout_s`` seconds (through the proxy when one is set). One attempt, no retries."""
    if constants.HF_HUB_OFFLINE:
        return "offline mode is on (HF_HUB_OFFLINE=1)"
    url = urlparse(constants.ENDPOINT)
    proxy = urllib.request.getproxies().get(url.scheme or "https")
    where = urlparse(proxy) if proxy and not urllib.request.proxy_bypass(url.hostname or "") else url
    host = where.hostname or ""
    port = where.port or (443 if where.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        what = "the proxy " if where is not url else ""
        return f"{what}{host} cannot be reached ({exc.strerror or type(exc).__name__})"
    return None


def require_online() -> None:
    """Raise HubOffline (a readable message) when the hub cannot be reached now."""
    reason = offline_reason()
    if reason:
        raise HubOffline(f"offline: {reason}. Downloaded models still work; connect to the internet to search "
                         "or download.")


def cached_state(repo_id: str) -> str:
    """'downloaded', 'partly downloaded' (a cancelled download to resume) or 'not downloaded'."""
    if is_cached(repo_id):
        return "downloaded"
    blobs = repo_cache(repo_id) / "blobs"
    return "partly downloaded" if blobs.is_dir() and any(blobs.glob("*.incomplete")) else "not downloaded"


def repo_cache(repo_id: str) -> Path:
    """``<HF_HUB_CACHE>/models--org--name``."""
    return cache_dir() / ("models--" + repo_id.replace("/", "--"))


def bytes_in_cache(repo_id: str) -> int:
    """Bytes of this repo's blobs, finished and partial (``*.incomplete``)."""
    blobs = repo_cache(repo_id) / "blobs"
    try:
        return sum(p.stat().st_size for p in blobs.iterdir() if p.is_file())
    except OSError:
        return 0


def cache_dir() -> Path:
    """The hub cache folder in use (HF_HUB_CACHE / HF_HOME aware): the trainer's one rule, read now."""
    return hf_hub_cache()
