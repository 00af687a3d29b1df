"""The out-of-memory recovery ladder (light): each rung keeps the effective batch exact.

Rungs in order of cost: a loss without full logits (``loss_kernel.ladder_kernel``: Liger's or the chunked
loss, exact, usually no slower); halve the micro-batch and double
accumulation (down to 1); gradient checkpointing (recompute); the MLP and norms over sequence tiles
(``speed.tiled_mlp``: exact; where the planner can plan the model tiled; CUDA: at long sequences one
checkpointed layer's recompute is what runs out); activation offload to pinned host RAM (PCIe time;
CUDA); 8-bit AdamW (approximate: only with ``plan_allow_approximate``; CUDA); the optimizer step fused into
backward (``_fused_step_rung``: no full gradient buffer; the whole per-GPU batch in one micro-batch, clipping off);
DeepSpeed ZeRO-2 with optimizer offload (which turns the fused step off: DeepSpeed runs its own step); ZeRO-3 with parameter offload (not for QLoRA: 4-bit weights cannot be sharded).

GRPO adds a rung: halve ``grpo.generation_batch_size`` (completions sampled at once: a smaller KV cache,
more sampling passes per step; kept a multiple of num_generations and of the micro-batch, dividing the
step's completions). It helps only when sampling ran out of memory, so it comes first for a sampling OOM
and after the micro-batch and checkpointing for an update OOM; ``phase`` says which (the worker's word),
else the planner's larger predicted phase is taken.

The ladder never changes a setting the user chose: every rung asks ``kept_settings`` (``recovery.ladder_keeps``,
which the planner resolves to the settings the user's config gives a value). A rung that would change one is
skipped, and the final out-of-memory message names it as what the user could still change
(``held_back``). Only the keys in ``LADDER_KEYS`` are ever changed.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterator

from trainer import config as config_mod
from trainer.config import in_backward
from trainer.config.loading import explicit_keys
from trainer.config.placements import DEFAULT, EIGHT_BIT, placement
from trainer.core import capabilities
from trainer.core.dotted import get_in
from trainer.core.errors import UserError
from trainer.models.spec import spec_for_run
from trainer.core.units import GIB
from trainer.planning import loss_kernel
from trainer.planning.context import Context, generation_candidates, make_setup, per_rank_batch
from trainer.planning.memory import estimate
from trainer.planning.search import can_tile


# Every setting a rung may change (tests check each rung against it): the settings recovery.ladder_keeps can hold.
LADDER_KEYS = ("speed.loss_kernel", "training.micro_batch_size", "training.gradient_accumulation_steps",
               "speed.gradient_checkpointing", "grpo.generation_batch_size", "speed.tiled_mlp",
               "speed.activation_offload", "training.optimizer", "deepspeed.enabled", "deepspeed.zero_stage",
               "deepspeed.offload_optimizer", "deepspeed.offload_params", "training.optimizer_in_backward",
               "training.max_grad_norm")


def kept_settings(cfg) -> frozenset[str]:
    """The settings no rung may change: ``recovery.ladder_keeps`` when it is a list; when it is still "auto" (a
    config the planner has not resolved), the ladder's settings that the user's config gives a value (not "auto")."""
    keep = cfg.recovery.ladder_keeps
    if keep != "auto":
        return frozenset(keep)
    data = config_mod.to_dict(cfg)
    return frozenset(k for k in LADDER_KEYS if k in explicit_keys(cfg) and get_in(data, k) != "auto")


def record_kept_settings(cfg, chosen=None):
    """``cfg`` with ``recovery.ladder_keeps`` written out when it is "auto": ``kept_settings`` of ``chosen`` (the
    config as the user wrote it, before the planner filled its "auto"s; default ``cfg``). Call it before a config
    is written whole (a run folder's config.yaml, the GUI's file, an export): a file that sets every key no longer
    says which ones the user chose."""
    if cfg.recovery.ladder_keeps != "auto":
        return cfg
    return config_mod.replace(cfg, **{"recovery.ladder_keeps": sorted(kept_settings(chosen or cfg))})


@dataclass(frozen=True)
class LadderStep:
    """One rung: the new config, the changed settings (dotted key → value) and why, in words."""

    config: object
    changes: dict
    why: str


def _loss_rung(cfg) -> tuple[dict, str] | None:
    """A run on HF's loss moves to a loss without the full tokens × vocabulary logits, where one is exact for
    this model and runs here (``loss_kernel.ladder_kernel``; an unknown architecture keeps HF's loss)."""
    try:
        family = spec_for_run(cfg).family
    except UserError:
        return None
    kernel = loss_kernel.ladder_kernel(cfg, family)
    if kernel is None:
        return None
    return ({"speed.loss_kernel": kernel},
            f"compute the loss with {loss_kernel.NAMES[kernel]} (no full tokens × vocabulary logits; same loss and "
            "gradients)")


def _micro_rung(cfg) -> tuple[dict, str] | None:
    """Halve the micro-batch (a divisor of the per-GPU batch, and of GRPO's generation batch), doubling accumulation."""
    t = cfg.training
    per_rank = per_rank_batch(cfg)
    mb = t.micro_batch_size
    floor = 2 if t.objective == "kto" else 1  # KTO estimates its KL term within a micro-batch
    gen = cfg.grpo.generation_batch_size if t.objective == "grpo" else per_rank
    smaller = [d for d in range(floor, mb // 2 + 1) if per_rank % d == 0 and gen % d == 0]
    if mb <= floor or not smaller:
        return None
    new_mb = max(smaller)
    return ({"training.micro_batch_size": new_mb, "training.gradient_accumulation_steps": per_rank // new_mb},
            f"micro-batch {mb} → {new_mb}, accumulation {t.gradient_accumulation_steps} → {per_rank // new_mb} "
            f"(effective batch stays {t.effective_batch_size})")


def _generation_rung(cfg) -> tuple[dict, str] | None:
    """GRPO: halve the completions sampled at once (whole groups, a multiple of the micro-batch)."""
    if cfg.training.objective != "grpo":
        return None
    gen, mb = cfg.grpo.generation_batch_size, cfg.training.micro_batch_size
    smaller = [g for g in generation_candidates(cfg, mb) if g <= gen // 2]
    if not smaller:
        return None
    new = max(smaller)
    per_rank = per_rank_batch(cfg)
    return ({"grpo.generation_batch_size": new},
            f"sample {new} completions at once instead of {gen} (a smaller KV cache; {per_rank // new} sampling "
            f"passes per optimizer step instead of {per_rank // gen}; the effective batch stays "
            f"{cfg.training.effective_batch_size})")


def _checkpointing_rung(cfg) -> tuple[dict, str] | None:
    if cfg.speed.gradient_checkpointing is True:
        return None
    floor = 2 if cfg.training.objective == "kto" else 1
    first = (f"micro-batch is already {floor}: " if cfg.training.micro_batch_size <= floor else "")
    return ({"speed.gradient_checkpointing": True},
            first + "turn on gradient checkpointing (recompute activations in backward)")


def grpo_phase_guess(cfg) -> str | None:
    """The GRPO phase the planner predicts is larger ("sampling" or "update"), or None when it cannot tell (not
    GRPO, an unknown architecture)."""
    if cfg.training.objective != "grpo":
        return None
    try:
        ctx = Context.for_resolved(cfg, spec_for_run(cfg))
    except UserError:
        return None
    ds = cfg.deepspeed
    est = estimate(ctx.spec, make_setup(ctx, cfg.training.micro_batch_size, cfg.speed.gradient_checkpointing is True,
                                        (ds.enabled is True, ds.zero_stage, ds.offload_optimizer, ds.offload_params)))
    return max(est.phases, key=est.phases.get) if est.phases else None


def _exact_rungs(cfg, phase: str | None) -> tuple:
    """The exact rungs after the loss: smaller micro-batch, checkpointing; for GRPO the generation batch too, first
    when sampling ran out of memory, else after checkpointing."""
    if cfg.training.objective == "grpo" and (phase or grpo_phase_guess(cfg)) == "sampling":
        return _generation_rung, _micro_rung, _checkpointing_rung
    return _micro_rung, _checkpointing_rung, _generation_rung


def _tiled_mlp_rung(cfg) -> tuple[dict, str] | None:
    """CUDA only, after checkpointing: the MLP and norms over sequence tiles (exact), where the planner can plan this
    model tiled (``search.can_tile``: supervised training, a layout the worker tiles) and DeepSpeed is off."""
    if cfg.device != "cuda" or cfg.speed.tiled_mlp is True or cfg.deepspeed.enabled is True:
        return None
    try:
        if not can_tile(Context.for_resolved(cfg, spec_for_run(cfg))):
            return None
    except UserError:
        return None
    return ({"speed.tiled_mlp": True},
            "run each layer's MLP and norms over tiles of the sequence (exact; their intermediates never exist for the "
            "whole sequence, in the forward or the recompute)")


def _activation_offload_rung(cfg) -> tuple[dict, str] | None:
    """CUDA only, before DeepSpeed: saved activations to pinned host RAM."""
    if cfg.device != "cuda" or cfg.deepspeed.enabled is True or cfg.speed.activation_offload is True:
        return None
    return ({"speed.activation_offload": True},
            "offload saved activations to pinned host RAM (TRL's activation offloading; PCIe time)")


def _eight_bit_rung(cfg) -> tuple[dict, str] | None:
    """CUDA only, approximate: 8-bit AdamW where plan_allow_approximate allows it and bitsandbytes is installed."""
    eight = placement(EIGHT_BIT)
    if (cfg.device != "cuda" or cfg.deepspeed.enabled is True or not cfg.plan_allow_approximate
            or cfg.training.optimizer != DEFAULT or cfg.method.type != "full" or not capabilities.installed(eight.package)):
        return None
    return ({"training.optimizer": eight.name},
            "keep AdamW's states in 8 bits (bitsandbytes; plan_allow_approximate allows it; updates differ slightly "
            "from 32-bit AdamW)")


def _fused_step_rung(cfg) -> tuple[dict, str] | None:
    """Before DeepSpeed: the optimizer step fused into backward, where it can run (``config.in_backward.runs``) and the
    planner predicts it needs less memory than ``cfg``: each parameter updated as its gradient completes (no full
    gradient buffer), which takes the whole per-GPU batch in one micro-batch (the effective batch stays exact) and
    no clipping (the global norm needs every gradient at once)."""
    if cfg.training.optimizer_in_backward is not None or not in_backward.runs(cfg):
        return None
    per_rank = per_rank_batch(cfg)
    changes = in_backward.changes(per_rank)
    try:
        now, fused = (_need(c) for c in (cfg, config_mod.replace(cfg, **changes)))
    except (UserError, config_mod.ConfigError):
        return None
    if fused >= now:
        return None
    return (changes, f"fuse the optimizer step into backward (each parameter updated as soon as its gradient is "
                     f"complete, no full gradient buffer: planned {now / GIB:.1f} → {fused / GIB:.1f} GiB); the "
                     f"effective batch {cfg.training.effective_batch_size} in one micro-batch of {per_rank}, gradient "
                     "clipping off")


def _need(cfg) -> int:
    """The planner's estimate for a resolved ``cfg``: peak device bytes, or host RAM on the CPU (bytes)."""
    ctx = Context.for_resolved(cfg, spec_for_run(cfg))
    ds, t = cfg.deepspeed, cfg.training
    est = estimate(ctx.spec, make_setup(ctx, t.micro_batch_size, cfg.speed.gradient_checkpointing is True,
                                        (ds.enabled is True, ds.zero_stage, ds.offload_optimizer, ds.offload_params),
                                        cfg.speed.activation_offload is True, t.optimizer))
    return est.peak_bytes if cfg.device == "cuda" else est.host_ram_bytes


def _optimizer_offload_rung(cfg) -> tuple[dict, str] | None:
    """DeepSpeed ZeRO-2 optimizer offload; DeepSpeed runs its own optimizer step, so a fused step is turned off."""
    ds = cfg.deepspeed
    if not capabilities.installed("deepspeed") or (ds.enabled is True and ds.offload_optimizer):
        return None
    fused_off = {"training.optimizer_in_backward": False} if cfg.training.optimizer_in_backward else {}
    return ({"deepspeed.enabled": True, "deepspeed.zero_stage": max(2, ds.zero_stage), "deepspeed.offload_optimizer": True,
             **fused_off}, "move optimizer states to CPU RAM (DeepSpeed ZeRO-2 optimizer offload)"
            + (", with the optimizer step after backward again" if fused_off else ""))


def _param_offload_rung(cfg) -> tuple[dict, str] | None:
    """ZeRO-3 with parameter offload; never for QLoRA (ZeRO-3 cannot shard 4-bit weights: the config refuses it)."""
    ds = cfg.deepspeed
    if (not capabilities.installed("deepspeed") or ds.enabled is not True or not ds.offload_optimizer
            or ds.offload_params or cfg.method.type == "qlora"):
        return None
    return ({"deepspeed.zero_stage": 3, "deepspeed.offload_params": True},
            "optimizer is offloaded: keep weights in CPU RAM too (ZeRO-3 parameter offload)")


def _rungs(cfg, phase: str | None) -> Iterator[tuple[dict, str]]:
    """Every rung that applies to ``cfg``, cheapest first, before asking which settings are the user's."""
    order = (_loss_rung, *_exact_rungs(cfg, phase), _tiled_mlp_rung, _activation_offload_rung, _eight_bit_rung,
             _fused_step_rung, _optimizer_offload_rung, _param_offload_rung)
    return (r for r in (rung(cfg) for rung in order) if r)


def _kept_in(cfg, changes: dict, kept: frozenset[str]) -> list[str]:
    """The user's settings a rung's ``changes`` would change (a key set to the value it has is no change)."""
    data = config_mod.to_dict(cfg)
    return [k for k, v in changes.items() if k in kept and get_in(data, k) != v]


def next_step(cfg, phase: str | None = None) -> LadderStep | None:
    """The next rung for ``cfg`` (resolved: no 'auto') that changes none of the user's settings, or None when the
    ladder is exhausted. ``phase``: where a GRPO run ran out of memory ("sampling" or "update"), when the worker
    said so."""
    kept = kept_settings(cfg)
    for changes, why in _rungs(cfg, phase):
        if not _kept_in(cfg, changes, kept):
            try:
                return LadderStep(config_mod.replace(cfg, **changes), changes, why)
            except config_mod.ConfigError:  # a rung the config's own rules refuse for this run: not a way out
                continue
    return None


def held_back(cfg, phase: str | None = None) -> list[dict]:
    """The rungs that apply to ``cfg`` but would change a setting the user chose: ``{"changes", "why", "yours"}``
    (``yours``: those settings), cheapest first. What the user could still change themselves."""
    kept = kept_settings(cfg)
    out = []
    for changes, why in _rungs(cfg, phase):
        mine = _kept_in(cfg, changes, kept)
        if mine:
            out.append({"changes": changes, "why": why, "yours": mine})
    return out


def exhausted_report(cfg, tried: list[dict], ladder_off: bool = False, phase: str | None = None) -> dict:
    """What was tried and what would fit instead: the message behind exit code 3. ``held_back``: the rungs left
    because they would change a setting of the user's, named first among the suggestions."""
    steps = [e.get("why", "") for e in tried]
    held = [] if ladder_off else held_back(cfg, phase)
    if ladder_off:
        head = "out of memory (recovery.oom_ladder is off)"
    elif held:
        head = (f"out of memory after {len(steps)} recovery step(s); the steps left would change settings your "
                f"config sets, which the ladder never does")
    else:
        head = f"out of memory after every recovery step ({len(steps)} tried)"
    suggestions = [_held_line(h) for h in held]
    first = next_step(cfg, phase) if ladder_off else None
    if first is not None:
        suggestions.append(f"turn recovery.oom_ladder on (its first step: {first.why})")
    if cfg.data.seq_len > 512:
        suggestions.append(f"a shorter sequence: data.seq_len {cfg.data.seq_len} → {cfg.data.seq_len // 2} "
                           f"(activations and logits shrink in proportion)")
    if cfg.method.type == "full":
        suggestions.append("LoRA adapters (method.type: lora): gradients and optimizer states only for the adapters")
    if cfg.method.type in ("full", "lora") and cfg.device == "cuda":
        suggestions.append("QLoRA (method.type: qlora): 4-bit base weights, about a quarter of the weight memory")
    suggestions.append("a smaller model, or close other apps using the GPU (trainpilot-cli probe lists them)")
    if not capabilities.installed("deepspeed"):
        suggestions.append("install DeepSpeed for CPU offload: pip install --no-build-isolation deepspeed")
    return {"message": head, "tried": steps, "held_back": held, "suggestions": suggestions}


def _held_line(held: dict) -> str:
    """One held-back rung in words: the change of the user's settings it needs, and what it saves."""
    change = ", ".join(f"{k}: {json.dumps(v)}" for k, v in held["changes"].items())
    yours = ", ".join(held["yours"])
    return (f"set {change} yourself (the ladder's next step: {held['why']}; it left {yours} alone because your "
            f"config sets it: recovery.ladder_keeps lists the settings it keeps)")
