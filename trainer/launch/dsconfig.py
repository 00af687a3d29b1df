"""The DeepSpeed config a run uses, derived from the resolved run config (light, no deepspeed import).

Batch sizes and precision are written as concrete values, so ``ds_config.json`` is exactly what
ran; HF's integration checks they agree with the Trainer's arguments.
"""
from __future__ import annotations

from trainer.config.resolved import ResolvedRunConfig


def deepspeed_config(cfg: ResolvedRunConfig) -> dict | None:
    """The ZeRO config dict of a resolved config, or None when DeepSpeed is off."""
    precision = cfg.speed.precision
    ds = cfg.deepspeed
    if ds.enabled is not True:
        return None
    t = cfg.training
    zero: dict = {"stage": ds.zero_stage, "overlap_comm": ds.overlap_comm, "contiguous_gradients": True,
                  "reduce_bucket_size": 5e7, "allgather_bucket_size": 5e7}
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": cfg.device != "cpu"}
    if ds.zero_stage == 3:
        zero.update({"stage3_prefetch_bucket_size": 5e7, "stage3_param_persistence_threshold": 1e5,
                     "stage3_gather_16bit_weights_on_model_save": True})
        if ds.offload_params:
            zero["offload_param"] = {"device": "cpu", "pin_memory": cfg.device != "cpu"}
    out = {
        "train_batch_size": t.effective_batch_size,
        "train_micro_batch_size_per_gpu": t.micro_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "gradient_clipping": t.max_grad_norm if t.max_grad_norm > 0 else 0.0,
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16", "loss_scale": 0, "initial_scale_power": 16},
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1_000_000_000,
        "wall_clock_breakdown": False,
    }
    if ds.offload_optimizer:
        # Offloaded optimizer states need DeepSpeed's CPU Adam: HF's torch AdamW cannot step on the CPU copy.
        out["optimizer"] = {"type": "AdamW", "params": {"lr": t.learning_rate, "betas": [0.9, 0.999], "eps": 1e-8,
                                                        "weight_decay": t.weight_decay}}
    return out
