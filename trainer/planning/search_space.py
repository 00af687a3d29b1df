"""The planner's search space: which values of each memory saver it may try (checkpointing, DeepSpeed, activation
offload, the optimizer's states), the levels in the order tried, a level in words, and the largest micro-batch that
fits at one level (``best_micro``). The search over them: ``planning.search``.
"""
from __future__ import annotations

from typing import Optional

from trainer.config.loading import explicit_keys
from trainer.config.placements import DEFAULT, EIGHT_BIT, placement
from trainer.core import capabilities
from trainer.planning import in_backward_plan
from trainer.planning.context import (
    Context,
    DsOption,
    fits,
    in_backward_of,
    generation_options,
    make_setup,
    micro_options,
)
from trainer.planning.memory import Estimate, estimate


def ckpt_options(ctx: Context) -> list[bool]:
    v = ctx.cfg.speed.gradient_checkpointing
    if isinstance(v, bool):
        return [v]
    return [False] if ctx.device == "cpu" else [False, True]


def ds_options(ctx: Context) -> list[DsOption]:
    d = ctx.cfg.deepspeed
    if d.enabled is True:
        return [(True, d.zero_stage, d.offload_optimizer, d.offload_params)]
    no_deepspeed = d.enabled is False or not capabilities.installed("deepspeed")
    if no_deepspeed or ctx.device == "cpu" or ctx.cfg.method.type == "qlora":
        return [(False, d.zero_stage, False, False)]
    opts: list[DsOption] = [(False, d.zero_stage, False, False)]
    if ctx.cfg.world_size > 1:  # sharding only saves memory across several GPUs
        opts += [(True, 2, False, False), (True, 3, False, False)]
    return opts + [(True, 2, True, False), (True, 3, True, False), (True, 3, True, True)]


def offload_options(ctx: Context) -> list[bool]:
    """Activation offload as set, else off and then on (CUDA only: TRL offloads from the GPU to the host; not
    planned with the layers split over cards, whose saved tensors live on several)."""
    v = ctx.cfg.speed.activation_offload
    if isinstance(v, bool):
        return [v]
    return [False, True] if ctx.device == "cuda" and not ctx.split_budgets else [False]


def optimizer_options(ctx: Context) -> list[str]:
    """The configured optimizer, then 8-bit AdamW where the user allows approximate savings
    (``plan_allow_approximate``), did not choose the optimizer, trains all weights, and bitsandbytes can run (CUDA)."""
    c = ctx.cfg
    mine = c.training.optimizer if "training.optimizer" in explicit_keys(c) else None
    if mine or not c.plan_allow_approximate or ctx.device != "cuda" or c.method.type != "full" or \
            c.training.optimizer != DEFAULT:
        return [c.training.optimizer]
    return [DEFAULT, EIGHT_BIT]


Level = tuple[DsOption, bool, str]  # (DeepSpeed option, activation offload, optimizer)


def levels(ctx: Context) -> list[Level]:
    """The memory savers in the order they are tried: plain, activation offload, 8-bit AdamW (if allowed),
    then DeepSpeed's (its own optimizer: the configured optimizer, no activation offload unless set)."""
    out: list[Level] = []
    offload, optims = offload_options(ctx), optimizer_options(ctx)
    if in_backward_of(ctx):  # the step in backward: no DeepSpeed; each state placement, activation offload off then on
        return [((False, ctx.cfg.deepspeed.zero_stage, False, False), off, opt)
                for opt in in_backward_plan.placements(ctx) for off in offload]
    for ds in ds_options(ctx):
        if ds[0]:
            out.append((ds, offload[0] if len(offload) == 1 else False, optims[0]))
            continue
        out += [(ds, off, optims[0]) for off in offload]
        out += [(ds, offload[-1], opt) for opt in optims[1:]]
    return out


def best_micro(ctx: Context, ckpt: bool, ds: DsOption, budget: Optional[int] = None, offload: Optional[bool] = None,
               optimizer: Optional[str] = None) -> Optional[tuple[int, Estimate, int]]:
    """The largest micro-batch (of the allowed ones) that fits with these settings, with (GRPO) the largest
    generation batch that fits beside it: (micro-batch, estimate, generation batch or 0)."""
    for mb in micro_options(ctx.cfg):
        for gen in generation_options(ctx.cfg, mb):
            est = estimate(ctx.spec, make_setup(ctx, mb, ckpt, ds, offload, optimizer, gen or None))
            if fits(ctx, est, budget):
                return mb, est, gen
    return None


def level_words(level: Level) -> str:
    """The memory savers of a level in words ("" for none)."""
    (on, stage, opt_off, par_off), offload, optimizer = level
    words = []
    if offload:
        words.append("activation offload")
    if placement(optimizer).saver and not on:
        words.append(placement(optimizer).saver)
    if on:
        extra = " + parameter offload" if par_off else (" + optimizer offload" if opt_off else "")
        words.append(f"DeepSpeed ZeRO-{stage}{extra}")
    return ", ".join(words)
