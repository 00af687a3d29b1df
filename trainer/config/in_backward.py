"""``training.optimizer_in_backward`` (the optimizer step fused into backward) written once: what rules it out
whatever the batch (``blockers``), whether it can run for a config and is worth it (``runs``), and the settings
that turn it on (``changes``). The worker's cross-checks (``config.cross_checks``), the planner
(``planning.in_backward_plan``), the alternatives, the Method page's options (``planning.verdict``) and the ladder read
them here. In ``trainer.config`` because the cross-checks, the lowest of those readers, are in this room.
Light: no pydantic, no torch.
"""
from __future__ import annotations

from typing import Optional, Union


def blockers(cfg, precision: Optional[str] = None) -> list[tuple[str, str]]:
    """What the fused step cannot run with, whatever the batch: ``(field, why, with the fix)`` for DeepSpeed (its own
    step), several GPUs (a parameter updated before the GPUs average its gradient) and fp16 (loss scaling unscales
    every gradient at once). ``precision``: the resolved one, when the config's is still ``auto``."""
    fused, out = "with training.optimizer_in_backward: true", []
    if cfg.deepspeed.enabled is True:
        out.append(("deepspeed.enabled", "DeepSpeed runs its own optimizer step, which cannot also run inside backward "
                    "as training.optimizer_in_backward: true asks; set deepspeed.enabled: false"))
    if cfg.world_size > 1:
        out.append(("distributed.num_gpus", f"{cfg.world_size} GPUs: {fused} a parameter would be updated from this "
                    "GPU's gradient before the GPUs average theirs; train on one GPU"))
    if (precision or cfg.speed.precision) == "fp16":
        out.append(("speed.precision", f"fp16 scales the loss and unscales every gradient at once before the step, "
                    f"which {fused} has already happened; use bf16 or fp32"))
    return out


def runs(cfg, precision: Optional[str] = None) -> bool:
    """Whether the fused step can run for ``cfg`` and is worth it: a full fine-tune (a LoRA run's gradients are
    small), not GRPO, and nothing in ``blockers``."""
    return cfg.method.type == "full" and cfg.training.objective != "grpo" and not blockers(cfg, precision)


def changes(micro: Union[int, str]) -> dict:
    """The config changes that run the step in backward: each optimizer step one micro-batch of ``micro`` (the whole
    per-GPU batch, or ``auto`` for the planner to make it so), no accumulation, no clipping (the global norm needs
    every gradient at once)."""
    return {"training.optimizer_in_backward": True, "training.micro_batch_size": micro,
            "training.gradient_accumulation_steps": 1, "training.max_grad_norm": 0.0}


NO_DEEPSPEED = {"deepspeed.enabled": False, "deepspeed.offload_optimizer": False, "deepspeed.offload_params": False}
