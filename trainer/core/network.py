"""Can the Hugging Face hub be reached from here? One connection attempt (seconds), the one answer for the GUI's
model picker and downloads, the ``data`` command and the hub-dataset check. huggingface_hub itself retries for
~25-70 s before it says "offline"; a process that will only look things up sets ``HF_HUB_OFFLINE=1`` once the
hub is known to be unreachable (``offline_unless_reachable``), and then answers from the cache at once.

Light: standard library only; ``HF_ENDPOINT``, ``HF_HUB_OFFLINE`` and the proxy settings are read when asked.
"""
from __future__ import annotations

import os
import socket
import urllib.request
from urllib.parse import urlparse

REACH_TIMEOUT_S = 4.0  # one connection attempt (seconds)
DEFAULT_ENDPOINT = "https://huggingface.co"
_TRUE = ("1", "true", "yes", "on")


def hub_offline_reason(timeout_s: float = REACH_TIMEOUT_S) -> str | None:
    """Why the hub (``HF_ENDPOINT``) cannot be reached now, in words, or None when it accepts a connection within
    ``timeout_s`` seconds (through the proxy when one is set). One attempt, no retries."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE:
        return "offline mode is on (HF_HUB_OFFLINE=1)"
    url = urlparse(os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT)
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


def offline_unless_reachable(env: dict | None = None) -> str | None:
    """When the hub cannot be reached, set ``HF_HUB_OFFLINE=1`` in ``env`` (default: this process's environment,
    before huggingface_hub is imported) so lookups answer from the cache at once; returns the reason, or None."""
    reason = hub_offline_reason()
    if reason:
        (os.environ if env is None else env)["HF_HUB_OFFLINE"] = "1"
    return reason
