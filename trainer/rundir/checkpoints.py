"""Checkpoint folders: which are complete, which is newest, where partial ones are staged.

A checkpoint is written into ``checkpoints/.staging-<step>/``, fsynced, given a marker file, and
renamed to ``checkpoints/checkpoint-<step>/``; a folder without the marker is never trusted. The marker also
says which engine wrote the checkpoint (``engine_meta``): a run resumed on another engine (the OOM ladder moving
a run onto DeepSpeed, or to ZeRO-3) cannot use the library's own loader, and ``engine_change`` says what carries
over (the worker's ``engine_switch`` does it; the supervisor's ``retry`` event says it).
Light module (standard library only).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from trainer.config.placements import DEFAULT, NAMES, Placement, placement

MARKER = "trainpilot_checkpoint.json"
_NAME = re.compile(r"^checkpoint-(\d+)$")


def staging_dir(root: Path, step: int) -> Path:
    """Where the checkpoint of ``step`` is written before it is renamed into place."""
    return Path(root) / f".staging-{step}"


def complete_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoint folders under ``root``, oldest step first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        m = _NAME.match(child.name)
        if m and child.is_dir() and (child / MARKER).is_file() and _marker_ok(child / MARKER):
            found.append((int(m.group(1)), child))
    return [p for _, p in sorted(found)]


def _marker_ok(path: Path) -> bool:
    try:
        return isinstance(json.loads(path.read_text(encoding="utf-8")), dict)
    except (OSError, ValueError):
        return False


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    done = complete_checkpoints(root)
    return done[-1] if done else None


def checkpoint_step(path: str | Path) -> int:
    """The optimizer step of a checkpoint folder (from its name)."""
    m = _NAME.match(Path(path).name)
    return int(m.group(1)) if m else -1


def fsync_tree(folder: Path) -> None:
    """Flush every file under ``folder`` to disk (so a power loss cannot leave renamed-but-empty files)."""
    for dirpath, _, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def clean_staging(root: str | Path) -> list[Path]:
    """Remove leftover ``.staging-*`` folders from a killed worker. Returns what was removed."""
    import shutil

    root = Path(root)
    removed = []
    if root.is_dir():
        for child in root.glob(".staging-*"):
            shutil.rmtree(child, ignore_errors=True)
            removed.append(child)
    return removed


def read_marker(path: str | Path) -> dict:
    """A checkpoint's marker (what the worker wrote: batch geometry, engine, step), or {} when unreadable. A marker
    written before it recorded ``world_size`` gets the number of ranks the checkpoint's own files show
    (``saved_ranks``), so a resume onto another number of GPUs is seen as one (and a ZeRO checkpoint converted)."""
    try:
        data = json.loads((Path(path) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    if "world_size" not in data:
        ranks = saved_ranks(path)
        if ranks:
            data = dict(data, world_size=ranks)
    return data


# ZeRO's per-rank optimizer partitions (bf16_ for a bf16 run), in the checkpoint's global_step<N>/ folder, and HF's
# per-rank random states (one rng_state.pth on one rank)
_ZERO_PARTITION = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt")
_RNG_STATE = re.compile(r"rng_state_(\d+)\.pth")


def saved_ranks(path: str | Path) -> int | None:
    """How many ranks wrote a checkpoint, read off its files: DeepSpeed ZeRO's optimizer partitions (one per rank),
    else HF's random states (``rng_state_<rank>.pth`` per rank, ``rng_state.pth`` alone for one); None when neither
    says."""
    path = Path(path)
    zero = {int(m.group(1)) for f in path.glob("global_step*/*_optim_states.pt") if (m := _ZERO_PARTITION.fullmatch(f.name))}
    if zero:
        return max(zero) + 1
    rng = {int(m.group(1)) for f in path.glob("rng_state_*.pth") if (m := _RNG_STATE.fullmatch(f.name))}
    if rng:
        return max(rng) + 1
    return 1 if (path / "rng_state.pth").is_file() else None


def engine_meta(cfg) -> dict:
    """The engine a run of ``cfg`` trains with, as each checkpoint's marker records it: DeepSpeed on/off, its ZeRO
    stage, whether the optimizer is DeepSpeed's CPU Adam (optimizer offload) and the configured optimizer."""
    ds = cfg.deepspeed.enabled is True
    return {"deepspeed": ds, "zero_stage": cfg.deepspeed.zero_stage if ds else None,
            "offload_optimizer": bool(ds and cfg.deepspeed.offload_optimizer), "optimizer": cfg.training.optimizer,
            "optimizer_in_backward": cfg.training.optimizer_in_backward is True, "world_size": cfg.world_size}


def _engine_key(meta: dict) -> tuple:
    """What decides the checkpoint's format: plain or DeepSpeed and its stage, and the optimizer's implementation.
    Not whether the step ran in backward: the fused step writes the separate step's ``optimizer.pt`` (in_backward).
    Under DeepSpeed also the number of ranks: ZeRO writes each rank's partition of the optimizer states (and, at
    stage 3, of the weights), which its own loader reads back only on as many ranks; a plain run's ``optimizer.pt``
    holds every state whatever the number of ranks that trained it."""
    if meta.get("deepspeed"):
        return ("deepspeed", meta.get("zero_stage"), "cpu_adam" if meta.get("offload_optimizer") else _moments(meta),
                meta.get("world_size"))
    return "plain", None, _moments(meta), _implementation(meta)


def _states(meta: dict) -> Placement:
    """Where the marker's run kept AdamW's states (``config.placements``; a marker without one: the default)."""
    name = meta.get("optimizer")
    return placement(name if name in NAMES else DEFAULT)


def _moments(meta: dict) -> str:
    return "8bit" if _states(meta).eight_bit else "32bit"


def _implementation(meta: dict) -> str:
    """Whose state format: PyTorch's AdamW (exp_avg, exp_avg_sq) or bitsandbytes' (state1, state2)."""
    return "torch" if _states(meta).bnb_class is None else "bitsandbytes"


def engine_label(meta: dict) -> str:
    """An engine in words: 'plain PyTorch (AdamW)', 'DeepSpeed ZeRO-2 with optimizer offload (CPU Adam)'."""
    paged = not meta.get("deepspeed") and _states(meta).paged
    optimizer = "8-bit AdamW" if _moments(meta) == "8bit" else "paged AdamW" if paged else "AdamW"
    if not meta.get("deepspeed"):
        return f"plain PyTorch ({optimizer})"
    offload = " with optimizer offload (CPU Adam)" if meta.get("offload_optimizer") else f" ({optimizer})"
    return f"DeepSpeed ZeRO-{meta.get('zero_stage')}{offload}"


def engine_change(marker: dict, cfg) -> dict | None:
    """None when a run of ``cfg`` resumes a checkpoint with this ``marker`` through the library's own loader (same
    engine and optimizer). Otherwise what carries over: ``{"from", "to"`` (engines in words), ``"carried"``,
    ``"not_carried"`` (lists in words)``}``. A marker older than the engine fields counts as the run's own optimizer."""
    now = engine_meta(cfg)
    old = {"deepspeed": bool(marker.get("deepspeed")), "zero_stage": marker.get("zero_stage"),
           "offload_optimizer": marker.get("offload_optimizer", now["offload_optimizer"]),
           "optimizer": marker.get("optimizer", now["optimizer"]),
           "world_size": marker.get("world_size", now["world_size"])}
    if _engine_key(old) == _engine_key(now):
        return None
    ranks = old["world_size"] != now["world_size"]
    carried = ["weights", "learning-rate schedule", "data position (the next step trains the next samples)",
               "random state"]
    not_carried = []
    if _moments(old) == _moments(now) == "32bit":
        carried.insert(1, "AdamW moments and step count (per parameter)")
    else:
        not_carried.append("optimizer moments: 8-bit and 32-bit AdamW states do not convert, so they restart from "
                           "zero (the first steps after the resume move like the first steps of a run)")
    if cfg.speed.precision == "fp16":
        not_carried.append("the fp16 loss scale (it starts again at 2^16 and settles within a few steps)")
    return {"from": engine_label(old) + (_on_ranks(old) if ranks else ""),
            "to": engine_label(now) + (_on_ranks(now) if ranks else ""), "carried": carried, "not_carried": not_carried}


def _on_ranks(meta: dict) -> str:
    n = meta["world_size"]
    return f" on {n} GPU{'s' if n != 1 else ''}"


def ranks_change(marker: dict, cfg) -> dict | None:
    """What a resume onto another number of ranks changed, or None (the same number, or a marker older than the
    field): ``from_ranks``, ``to_ranks``, ``micro_batch_size`` and ``gradient_accumulation_steps`` (each ``[was,
    now]``), ``effective_batch_size`` (now), ``kept`` (whether it is the checkpoint's), and ``message``: "resumed on 1
    GPU (was 2): accumulation 2 → 4, effective batch 8 kept". The resume keeps the effective batch exact by
    splitting it anew (``trainer.supervisor.create.resume_config``), so the steps after it average as many samples,
    in the same order, as the steps before it."""
    was, now = marker.get("world_size"), cfg.world_size
    if not isinstance(was, int) or was == now:
        return None
    t = cfg.training
    micro = [marker.get("micro_batch_size"), t.micro_batch_size]
    accumulation = [marker.get("gradient_accumulation_steps"), t.gradient_accumulation_steps]
    kept = marker.get("effective_batch_size") == t.effective_batch_size
    parts = [f"{name} {a} → {b}" for name, (a, b) in (("micro-batch", micro), ("accumulation", accumulation))
             if a != b and a is not None]
    batch = (f"effective batch {t.effective_batch_size} kept" if kept else
             f"effective batch {marker.get('effective_batch_size')} → {t.effective_batch_size}")
    gpus = f"GPU{'s' if now != 1 else ''}"
    message = f"resumed on {now} {gpus} (was {was}): " + ", ".join(parts + [batch])
    return {"from_ranks": was, "to_ranks": now, "micro_batch_size": micro, "gradient_accumulation_steps": accumulation,
            "effective_batch_size": t.effective_batch_size, "kept": kept, "message": message}
