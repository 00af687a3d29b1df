"""The out-of-memory recovery ladder (light): each rung keeps the effective batch exact.

Order: halve the micro-batch and double accumulation (down to 1); then gradient checkpointing;
then DeepSpeed ZeRO-2 with optimizer offload; then ZeRO-3 with parameter offload.
"""
from __future__ import annotations

from dataclasses import dataclass

from trainer import config as config_mod
from trainer.core import capabilities


@dataclass(frozen=True)
class LadderStep:
    """One rung: the new config, the changed settings (dotted key → value) and why, in words."""

    config: object
    changes: dict
    why: str


def next_step(cfg) -> LadderStep | None:
    """The next rung for ``cfg`` (resolved: no 'auto'), or None when the ladder is exhausted."""
    t, ds = cfg.training, cfg.deepspeed
    per_rank = t.effective_batch_size // cfg.world_size
    mb = t.micro_batch_size
    floor = 2 if t.objective == "kto" else 1  # KTO estimates its KL term within a micro-batch
    smaller = [d for d in range(floor, mb // 2 + 1) if per_rank % d == 0]
    if mb > floor and smaller:
        new_mb = max(smaller)
        changes = {"training.micro_batch_size": new_mb, "training.gradient_accumulation_steps": per_rank // new_mb}
        why = (f"micro-batch {mb} → {new_mb}, accumulation {t.gradient_accumulation_steps} → {per_rank // new_mb} "
               f"(effective batch stays {t.effective_batch_size})")
    elif cfg.speed.gradient_checkpointing is not True:
        changes = {"speed.gradient_checkpointing": True}
        why = "micro-batch is already 1: turn on gradient checkpointing (recompute activations in backward)"
    elif not capabilities.installed("deepspeed"):
        return None
    elif ds.enabled is not True or not ds.offload_optimizer:
        changes = {"deepspeed.enabled": True, "deepspeed.zero_stage": max(2, ds.zero_stage),
                   "deepspeed.offload_optimizer": True}
        why = "checkpointing is on: move optimizer states to CPU RAM (DeepSpeed ZeRO-2 optimizer offload)"
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
