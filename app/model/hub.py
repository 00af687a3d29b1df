"""The Hugging Face hub as the GUI sees it: what is in the standard cache, what a model weighs,
and shipped architectures told apart from models (light: huggingface_hub, no torch)."""
from __future__ import annotations

from pathlib import Path

from huggingface_hub import constants, try_to_load_from_cache
from huggingface_hub.utils import HFValidationError, validate_repo_id

from trainer.core import network
from trainer.core.paths import MODELS_DIR, hf_hub_cache, hf_repo_cache
from trainer.models import sources


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


REACH_TIMEOUT_S = network.REACH_TIMEOUT_S  # one connection attempt (seconds); huggingface_hub's own retries take ~25 s


class HubOffline(OSError):
    """The hub cannot be reached from here: the message says so in words (never a socket error)."""


def offline_reason(timeout_s: float = REACH_TIMEOUT_S) -> str | None:
    """Why the hub (``HF_ENDPOINT``) cannot be reached now, in words, or None (``trainer.core.network``)."""
    if constants.HF_HUB_OFFLINE:  # set when huggingface_hub was imported
        return "offline mode is on (HF_HUB_OFFLINE=1)"
    return network.hub_offline_reason(timeout_s)


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
    """``<HF_HUB_CACHE>/models--org--name`` (``trainer.core.paths.hf_repo_cache``)."""
    return hf_repo_cache(repo_id)


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


def looks_like_hub_id(text: str | None) -> bool:
    """True for ``org/name`` as the hub spells ids (huggingface_hub's own rule) that is not a folder on this
    computer: what Download… can fetch."""
    if not text or text.count("/") != 1 or sources.is_local(text):
        return False
    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True
