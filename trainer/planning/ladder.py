"""The out-of-memory recovery ladder (light): each rung keeps the effective batch exact.

Rungs in order of cost: a loss without full logits (``loss_kernel.ladder_kernel``: Liger's or the chunked
loss, exact, usually no slower); halve the micro-batch and double
accumulation (down to 1); gradient checkpointing (recompute); activation offload to pinned host RAM
(PCIe time; CUDA); 8-bit AdamW (approximate: only with ``plan_allow_approximate``; CUDA); DeepSpeed
ZeRO-2 with optimizer offload; ZeRO-3 with parameter offload.

GRPO adds a rung: halve ``grpo.generation_batch_size`` (completions sampled at once: a smaller KV cache,
more sampling passes per step; kept a multiple of num_generations and of the micro-batch, dividing the
step's completions). It helps only when sampling ran out of memory, so it comes first for a sampling OOM
and after the micro-batch and checkpointing for an update OOM; ``phase`` says which (the worker's word),
else the planner's larger predicted phase is taken.
"""
from __future__ import annotations

from dataclasses import dataclass

from trainer import config as config_mod
from trainer.core import capabilities
from trainer.core.errors import UserError
from trainer.models.spec import spec_for_run
from trainer.planning import loss_kernel
from trainer.planning.context import Context, generation_candidates, make_setup
from trainer.planning.memory import estimate


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
    per_rank = t.effective_batch_size // cfg.world_size
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
    per_rank = cfg.training.effective_batch_size // cfg.world_size
    return ({"grpo.generation_batch_size": new},
            f"sample {new} completions at once instead of {gen} (a smaller KV cache; {per_rank // new} sampling "
            f"passes per optimizer step instead of {per_rank // gen}; the effective batch stays "
            f"{cfg.training.effective_batch_size})")


def _checkpointing_rung(cfg) -> tuple[dict, str] | None:
    if cfg.speed.gradient_checkpointing is True:
        return None
    return ({"speed.gradient_checkpointing": True},
            "micro-batch is already 1: turn on gradient checkpointing (recompute activations in backward)")


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


def _cheap_rung(cfg, phase: str | None = None) -> tuple[dict, str] | None:
    """The free and the exact rungs: a loss without full logits, smaller micro-batch, checkpointing; for GRPO the generation
    batch too, first when sampling ran out of memory, else after checkpointing."""
    loss = _loss_rung(cfg)
    if loss:
        return loss
    if cfg.training.objective == "grpo" and (phase or grpo_phase_guess(cfg)) == "sampling":
        order = (_generation_rung, _micro_rung, _checkpointing_rung)
    else:
        order = (_micro_rung, _checkpointing_rung, _generation_rung)
    return next((r for r in (rung(cfg) for rung in order) if r), None)


def _gpu_rung(cfg) -> tuple[dict, str] | None:
    """The CUDA-only rungs before DeepSpeed: activation offload, then 8-bit AdamW where allowed."""
    if cfg.device != "cuda" or cfg.deepspeed.enabled is True:
        return None
    if cfg.speed.activation_offload is not True:
        return ({"speed.activation_offload": True},
                "checkpointing is on: offload saved activations to pinned host RAM (TRL's activation offloading)")
    if (cfg.plan_allow_approximate and cfg.training.optimizer == "adamw" and cfg.method.type == "full"
            and capabilities.installed("bitsandbytes")):
        return ({"training.optimizer": "adamw_8bit"},
                "activations are offloaded: keep AdamW's states in 8 bits (bitsandbytes; plan_allow_approximate "
                "allows it; updates differ slightly from 32-bit AdamW)")
    return None


def next_step(cfg, phase: str | None = None) -> LadderStep | None:
    """The next rung for ``cfg`` (resolved: no 'auto'), or None when the ladder is exhausted. ``phase``: where a
    GRPO run ran out of memory ("sampling" or "update"), when the worker said so."""
    ds = cfg.deepspeed
    rung = _cheap_rung(cfg, phase) or _gpu_rung(cfg)
    if rung:
        changes, why = rung
    elif not capabilities.installed("deepspeed"):
        return None
    elif ds.enabled is not True or not ds.offload_optimizer:
        changes = {"deepspeed.enabled": True, "deepspeed.zero_stage": max(2, ds.zero_stage),
                   "deepspeed.offload_optimizer": True}
        why = "on the GPU nothing cheaper is left: move optimizer states to CPU RAM (DeepSpeed ZeRO-2 optimizer offload)"
    elif not ds.offload_params:
        changes = {"deepspeed.zero_stage": 3, "deepspeed.offload_params": True}
        why = "optimizer is offloaded: keep weights in CPU RAM too (ZeRO-3 parameter offload)"
    else:
        return None
    return LadderStep(config_mod.replace(cfg, **changes), changes, why)


def exhausted_report(cfg, tried: list[dict], ladder_off: bool = False) -> dict:
    """What was tried and what would fit instead: the message behind exit code 3."""
    steps = [e.get("why", "") for e in tried]
    if ladder_off:
        head = "out of memory (recovery.oom_ladder is off)"
    else:
        head = f"out of memory after every recovery step ({len(steps)} tried)"
    suggestions = []
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
    return {"message": head, "tried": steps, "suggestions": suggestions}
