"""Writing the plan's settings: the values the search found for the fields a config leaves "auto" (the effective
batch kept exact), the ones that follow the machine (device, precision, dtype), and the safe values for a model the
planner cannot predict.
"""
from __future__ import annotations

from typing import Optional

from trainer.config.resolved import resolve_dtype
from trainer.planning import kernels, loss_kernel
from trainer.planning.context import Context, DsOption, generation_options, micro_options, per_rank_batch


def auto_settings(cfg, mb: int, ckpt: bool, ds: DsOption, offload: bool = False, optimizer: Optional[str] = None,
                   generation: int = 0) -> dict:
    """The search's values for the fields the config leaves "auto" (the effective batch kept exact)."""
    settings: dict = {}
    if cfg.training.micro_batch_size == "auto":
        settings["training.micro_batch_size"] = mb
    if cfg.training.gradient_accumulation_steps == "auto":
        settings["training.gradient_accumulation_steps"] = max(1, per_rank_batch(cfg) // mb)
    if cfg.speed.gradient_checkpointing == "auto":
        settings["speed.gradient_checkpointing"] = ckpt
    if cfg.deepspeed.enabled == "auto":
        settings.update({"deepspeed.enabled": ds[0], "deepspeed.zero_stage": ds[1],
                         "deepspeed.offload_optimizer": ds[2], "deepspeed.offload_params": ds[3]})
    if cfg.speed.activation_offload == "auto":
        settings["speed.activation_offload"] = offload
    if optimizer and optimizer != cfg.training.optimizer:
        settings["training.optimizer"] = optimizer
    if generation and cfg.grpo.generation_batch_size == "auto":
        settings["grpo.generation_batch_size"] = generation
    return settings


def split_settings(cfg, est) -> dict:
    """The layers per card of a model split over cards (``planning/layer_split``), where the config leaves them."""
    if not est.cards or cfg.distributed.layers_per_gpu != "auto":
        return {}
    return {"distributed.layers_per_gpu": [c["layers"] for c in est.cards]}


def device_settings(cfg, ctx: Context) -> dict:
    """The auto values that follow the machine rather than the memory search: device, precision and
    the weights' dtype."""
    out = {}
    if cfg.device == "auto":
        out["device"] = ctx.device
    if cfg.speed.precision == "auto":
        out["speed.precision"] = ctx.precision
    if cfg.model.dtype == "auto":
        out["model.dtype"] = resolve_dtype("auto", ctx.precision)
    return out


def fallback_settings(cfg, ctx: Context) -> dict:
    """Safe values when the memory cannot be predicted: the smallest micro-batch, checkpointing on a
    GPU, no DeepSpeed; for GRPO the smallest generation batch (whole groups, one micro-batch's multiple)."""
    mb = micro_options(cfg)[-1]
    out = auto_settings(cfg, mb, ctx.device == "cuda", (False, cfg.deepspeed.zero_stage, False, False),
                         generation=min(generation_options(cfg, mb)))
    if cfg.speed.loss_kernel == "auto":
        out["speed.loss_kernel"] = loss_kernel.resolve_unplanned(cfg)
    return {**out, **kernels.resolve_unplanned(cfg)}
