"""A webhook message when a run finishes, fails, stops or recovers from out-of-memory.

The URL comes from the environment variable that ``notify.webhook_url_env`` names, else from the
OS keyring entry ``trainpilot/<that name>``; it is never written anywhere. Discord and Slack get
their own message shapes (chosen from the URL or ``notify.webhook_format``), anything else a plain
JSON object. Sending uses the standard library with a short timeout; a failure becomes a
``warning`` event, never a failed run.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from trainer import config as config_mod
from trainer.core import secrets
from trainer.rundir.records import WarningEvent

TIMEOUT_SECONDS = 5.0
ICONS = {"finished": "✅", "failed": "❌", "stopped": "⏹", "oom_recovered": "♻"}


def message(kind: str, run_name: str, info: dict) -> str:
    """One human line about the outcome (no secrets: the caller's ``info`` is redacted)."""
    step = info.get("step")
    where = f" at step {step}" + (f"/{info['max_steps']}" if info.get("max_steps") else "") if step is not None else ""
    text = {
        "finished": f"run '{run_name}' finished{where}" + (f" (loss {info['loss']:.4g})"
                                                           if isinstance(info.get("loss"), (int, float)) else ""),
        "failed": f"run '{run_name}' failed{where}: {info.get('message', 'see train.log')}",
        "stopped": f"run '{run_name}' stopped on request{where}; resume with trainpilot-cli resume",
        "oom_recovered": f"run '{run_name}' ran out of memory and recovers: {info.get('why', '')}",
    }.get(kind, f"run '{run_name}': {kind}")
    return f"{ICONS.get(kind, '')} TrainPilot: {text}".strip()


def webhook_format_of(url: str, configured: str = "auto") -> str:
    """discord, slack or json: the configured format, else guessed from the URL's host."""
    if configured != "auto":
        return configured
    host = urllib.parse.urlsplit(url).hostname or ""
    if host.endswith(("discord.com", "discordapp.com")):
        return "discord"
    if host.endswith("slack.com"):
        return "slack"
    return "json"


def payload(fmt: str, kind: str, run_name: str, info: dict) -> dict:
    """The request body for ``fmt``: Discord ``content``, Slack ``text``, or a JSON object with the facts."""
    text = message(kind, run_name, info)
    if fmt == "discord":
        return {"username": "TrainPilot", "content": text[:2000]}
    if fmt == "slack":
        return {"text": text}
    return {"text": text, "event": kind, "run": run_name, **{k: info[k] for k in ("step", "max_steps", "loss")
                                                             if k in info}}


def send(run_dir: Path, kind: str, info: dict, events) -> bool:
    """Post the ``kind`` message for ``run_dir`` when its config asks for it. True when delivered."""
    try:
        cfg = config_mod.load(Path(run_dir) / "config.yaml")
    except config_mod.ConfigError:
        return False
    n = cfg.notify
    if not n.webhook_url_env or kind not in n.events:
        return False
    url = secrets.named_secret(n.webhook_url_env)
    if not url:
        events.emit(WarningEvent(code="notify_unset", message=f"notify: {n.webhook_url_env} is not set (nor in the "
                                 f"keyring as trainpilot/{n.webhook_url_env}); no webhook message sent"))
        return False
    clean = {k: secrets.redact(v, [url]) if isinstance(v, str) else v for k, v in info.items()}
    body = json.dumps(payload(webhook_format_of(url, n.webhook_format), kind, cfg.name, clean)).encode("utf-8")
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "TrainPilot"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
            response.read(1024)
        return True
    except (urllib.error.URLError, OSError, ValueError) as exc:
        why = secrets.redact(str(getattr(exc, "reason", None) or exc), [url])
        events.emit(WarningEvent(code="notify_failed",
                                 message=f"notify: the webhook message about '{kind}' was not delivered ({why})"))
        return False
