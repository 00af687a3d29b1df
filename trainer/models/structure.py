"""Model structure records: where the planner's knowledge of an architecture comes from. Light: no torch.

A record is what the structure probe (``python -m trainer.worker.probes.structure_probe``, worker side) wrote
after building the model from its ``config.json`` on the meta device: exact parameters, every decoder layer's kind and
Linear shapes, experts, towers, and what each layer kind saves for backward. Records are found, in order: shipped
with TrainPilot for the architectures in ``trainer/resources/models/`` (``structures/<hash>.json``), in the user
cache (``trainer.core.paths.cache_dir()/structures``), else made by one probe child and cached. They are keyed by
the config's content hash (its values, not its file name), so an edited config is probed again.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Optional

from trainer.core import entrypoints
from trainer.core.errors import EXIT_BAD_INPUT, UserError
from trainer.core.paths import STRUCTURES_DIR, cache_dir
from trainer.models import vision

# The structure record's format, written by the structure probe (2: the tiled layers measured too): a record of
# another format is probed again
FORMAT = 2
PROBE_TIMEOUT_S = 900


class ArchitectureUnknown(UserError):
    """transformers cannot build the architecture here, or its layers are of a kind the planner does not measure."""


def canonical(cfg: dict) -> dict:
    """The config's values that define the model (TrainPilot's own ``_`` notes left out)."""
    return {k: v for k, v in cfg.items() if not str(k).startswith("_")}


def config_hash(cfg: dict) -> str:
    """The content hash records are keyed by (16 hex digits of SHA-256 over the sorted JSON)."""
    text = json.dumps(canonical(cfg), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def user_records_dir() -> Path:
    """The user cache's record folder (read now: follows ``TRAINPILOT_CACHE``)."""
    return cache_dir() / "structures"


def read_record(path: Path) -> Optional[dict]:
    """The JSON object in ``path`` (a record or a refusal), or None when it is missing, unreadable or not an object."""
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return rec if isinstance(rec, dict) else None


def transformers_version() -> str:
    """The installed transformers' version (package metadata: no import), or '' when it is not installed."""
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return ""


def cached_record(cfg: dict, measured: bool = True) -> tuple[Optional[dict], str]:
    """(record, 'shipped' | 'cache') when one exists for this config (with measured activations when
    ``measured``), else (None, ''). A cached refusal (the probe said it cannot plan this architecture, with this
    transformers) raises ArchitectureUnknown again."""
    key = config_hash(cfg)
    for origin, folder in (("shipped", STRUCTURES_DIR), ("cache", user_records_dir())):
        rec = read_record(folder / f"{key}.json")
        if is_current(rec, cfg, measured):
            return rec, origin
    refusal = read_record(user_records_dir() / f"{key}.refused.json")
    if refusal and refusal.get("transformers") == transformers_version():
        raise ArchitectureUnknown(refusal["message"])
    return None, ""


def is_current(rec: Optional[dict], cfg: dict, measured: bool = True) -> bool:
    """Whether ``rec`` is a record this code plans ``cfg`` with, without a probe: this FORMAT, measured activations
    (when ``measured``; an encoder-decoder has none) and, for a vision-language config, its ``vision`` part. A
    shipped record that is not current costs every user a probe (seconds of CPU) the first time the model is judged:
    tests/test_structure.py holds every shipped one to this."""
    return (rec is not None and rec.get("format") == FORMAT
            and bool(rec.get("activations") or not measured or rec.get("encoder_decoder"))
            and _has_vision_part(rec, cfg))


def _has_vision_part(rec: dict, cfg: dict) -> bool:
    """A vision-language config's record carries its ``vision`` part (what a picture costs; records made before the
    probe measured pictures lack it and are made again)."""
    return "vision" in rec or not vision.is_vision_language(cfg)


def record_for(cfg: dict, name: str = "", measured: bool = True) -> tuple[dict, str]:
    """(record, origin): shipped or cached, else made now by one probe child (origin 'probe'; its ``seconds`` say
    how long). ``measured`` False: the structure alone will do (a family with hand-fitted formulas), which makes
    the probe quicker. Raises ArchitectureUnknown (a UserError) with what to do when it cannot be planned."""
    rec, origin = cached_record(cfg, measured)
    if rec is not None:
        return rec, origin
    with _lock(config_hash(cfg)):  # the GUI's pages may ask for one new model from two threads: probe it once
        rec, origin = cached_record(cfg, measured)
        if rec is not None:
            return rec, origin
        return run_probe(cfg, name, measured=measured), "probe"


_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _lock(key: str) -> threading.Lock:
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(key, threading.Lock())


def _atomic_write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def run_probe(cfg: dict, name: str = "", timeout_s: float = PROBE_TIMEOUT_S, measured: bool = True) -> dict:
    """Run the structure probe child on ``cfg``; cache its record (or its refusal). Blocks for seconds (imports
    torch and transformers, measures on fake tensors): the GUI calls the planner off its thread."""
    folder = user_records_dir()
    folder.mkdir(parents=True, exist_ok=True)
    key = config_hash(cfg)
    stem = f"{key}.{os.getpid()}.{threading.get_ident()}.{time.monotonic_ns()}"
    config_path, out = folder / f"{stem}.config.json", folder / f"{stem}.out.json"
    config_path.write_text(json.dumps(canonical(cfg)), encoding="utf-8")
    started = time.perf_counter()
    try:
        args = [str(config_path), "--out", str(out)] + ([] if measured else ["--no-activations"])
        proc = subprocess.run(entrypoints.python_m(entrypoints.STRUCTURE_PROBE, *args), capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise UserError(f"reading the structure of model '{name or cfg.get('model_type')}' took over "
                        f"{timeout_s:.0f} s and was stopped; set training values instead of 'auto'") from None
    finally:
        config_path.unlink(missing_ok=True)
    return _probe_result(proc, out, cfg, key, name, time.perf_counter() - started)


def _probe_result(proc, out: Path, cfg: dict, key: str, name: str, seconds: float) -> dict:
    lines = [x for x in (proc.stderr or "").splitlines() if x.strip()]
    if proc.returncode == EXIT_BAD_INPUT and lines:
        message = unknown_message(name, cfg, lines[-1])
        _atomic_write(user_records_dir() / f"{key}.refused.json",
                      {"message": message, "transformers": transformers_version()})
        raise ArchitectureUnknown(message)
    rec = read_record(out) if proc.returncode == 0 else None
    out.unlink(missing_ok=True)
    if rec is None:
        why = lines[-1] if lines else f"exit code {proc.returncode}"
        raise ArchitectureUnknown(f"model '{name or cfg.get('model_type')}': the structure probe failed ({why}); "
                                  "is transformers installed (doctor checks)? Set training values instead of 'auto'")
    rec["probe_seconds"] = round(seconds, 1)
    _atomic_write(user_records_dir() / f"{key}.json", rec)
    return rec


def unknown_message(name: str, cfg: dict, reason: str) -> str:
    """The one sentence for an architecture the planner cannot know: why, and what to do."""
    kind = cfg.get("model_type") or "?"
    fix = "upgrade transformers (pip install -U transformers) if a newer release knows it, or " \
        if "cannot build" in reason or "could not build" in reason else ""
    return (f"model '{name or kind}': architecture '{kind}' is not known to the memory estimator: {reason}; "
            f"{fix}set training values (micro-batch, checkpointing) instead of 'auto'")


def ship(cfg: dict, rec: dict) -> Path:
    """Store ``rec`` as the shipped record of ``cfg`` (tools/make_structures.py, when a shipped config changes)."""
    path = STRUCTURES_DIR / f"{config_hash(cfg)}.json"
    _atomic_write(path, {k: v for k, v in rec.items() if k != "probe_seconds"})
    return path
