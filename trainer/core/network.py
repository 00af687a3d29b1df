"""Can the Hugging Face hub be reached from here? One connection attempt (seconds), the one answer for the GUI's
model picker and downloads, the ``data`` command and the hub-dataset check. huggingface_hub itself retries for
~25-70 s before it says "offline"; a process that will only look things up sets ``HF_HUB_OFFLINE=1`` once the
hub is known to be unreachable (``offline_unless_reachable``), and then answers from the cache at once.

Light: standard library only; ``HF_ENDPOINT``, ``HF_HUB_OFFLINE`` and the proxy settings are read when asked.
"""
from __future__ import annotations

import os
import socket
import threading
import time
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
    what = "the proxy " if where is not url else ""
    started = time.monotonic()
    try:
        address = _resolve(host, port, timeout_s)
        remaining = max(0.1, timeout_s - (time.monotonic() - started))
        socket.create_connection(address, timeout=remaining).close()
    except OSError as exc:
        return f"{what}{host} cannot be reached ({exc.strerror or str(exc) or type(exc).__name__})"
    return None


def _resolve(host: str, port: int, timeout_s: float) -> tuple[str, int]:
    """``host``'s first address, looked up within ``timeout_s`` (OSError when the lookup fails or takes longer).
    The system's resolver has no timeout of its own: where no name server answers it waits ~10-20 s per name, which
    ``create_connection``'s timeout does not cover. The lookup runs in a daemon thread left to finish alone."""
    found: list = []

    def look() -> None:
        try:
            found.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][:2])
        except OSError as exc:
            found.append(exc)

    worker = threading.Thread(target=look, name="hub-name-lookup", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not found:
        raise OSError(f"the name lookup of {host} took over {timeout_s:g} s")
    if isinstance(found[0], OSError):
        raise found[0]
    return found[0]


def offline_unless_reachable(env: dict | None = None) -> str | None:
    """When the hub cannot be reached, set ``HF_HUB_OFFLINE=1`` in ``env`` (default: this process's environment,
    before huggingface_hub is imported) so lookups answer from the cache at once; returns the reason, or None."""
    reason = hub_offline_reason()
    if reason:
        (os.environ if env is None else env)["HF_HUB_OFFLINE"] = "1"
    return reason
