"""The search's answer (``Choice``): the settings it picked with their estimate, verdict, settings to write and
reasons in words, made by ``make_choice`` from one level and micro-batch; ``model_summary``: the model as a plan
reports it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from trainer import config as config_mod
from trainer.config.placements import DEFAULT
from trainer.models.spec import ModelSpec
from trainer.planning.context import Context, DsOption, fits, make_setup, need
from trainer.planning.memory import Estimate, fragmentation_share
from trainer.planning.reasons import reasons
from trainer.planning.saver_memory import margin_notes
from trainer.planning.savings import mask_reason, savings, savings_reasons
from trainer.planning.search_space import Level
from trainer.planning.settings_writer import auto_settings, split_settings


@dataclass
class Choice:
    micro: int
    ckpt: bool
    ds: DsOption
    estimate: Estimate
    peak: int
    verdict: str
    settings: dict
    reasons: list
    offload: bool = False  # activation offload
    optimizer: str = DEFAULT  # where AdamW's states live (config.placements)
    savings: list = None  # what each memory saver in this choice saves (planning.savings)
    generation: int = 0  # GRPO: completions sampled at once per GPU (0: not GRPO)
    loss_kernel: str = "hf"  # the loss the run computes (planning.loss_kernel)
    # where this does not fit: the largest effective batch the step fused into backward keeps exact in one
    # micro-batch, and its peak (planning.search.largest_in_backward_batch); None when none fits or it was not asked
    largest_in_backward: Optional[tuple[int, int]] = None


def choice_level(choice: Choice) -> Level:
    """The level a choice was made at."""
    return choice.ds, choice.offload, choice.optimizer


def verdict_of(ctx: Context, est: Estimate) -> str:
    if fits(ctx, est):
        return "fits"
    host_ok = ctx.device == "cpu" or est.host_ram_bytes <= ctx.host_budget
    return "tight" if host_ok and need(ctx, est) <= ctx.usable else "does_not_fit"


def make_choice(ctx: Context, mb: int, ckpt: bool, level: Level, est: Estimate, found: dict, gen: int = 0,
            tradeoff: Optional[list] = None) -> Choice:
    ds, off, opt = level
    settings = {**auto_settings(ctx.cfg, mb, ckpt, ds, off, opt, gen), **split_settings(ctx.cfg, est)}
    verdict = verdict_of(ctx, est)
    judged = _with_generation(ctx, gen)  # the reasons' what-ifs keep this generation batch
    saved = savings(judged, mb, ckpt, level, est)
    why = reasons(judged, mb, ckpt, ds, est, verdict, found, off, opt)
    if tradeoff:  # after the budget and the model, before the batch and the checkpointing sentences
        why[2:2] = tradeoff
        if off:  # checkpointing is off because offload is estimated faster, not because it is "not needed"
            why = [r for r in why if not r.startswith("gradient checkpointing off: not needed")]
    at = len(why) - (verdict != "fits")  # the verdict's sentence stays last
    setup = make_setup(ctx, mb, ckpt, ds, off, opt)
    why[at:at] = savings_reasons(judged, saved) + mask_reason(judged, setup, est) + \
        margin_notes(est.breakdown, setup, fragmentation_share(setup))
    return Choice(mb, ckpt, ds, est, need(ctx, est), verdict, settings, why, off, opt, saved, gen)


def _with_generation(ctx: Context, gen: int) -> Context:
    """``ctx`` whose config names the chosen GRPO generation batch (itself when there is none to name)."""
    if not gen or ctx.cfg.grpo.generation_batch_size != "auto":
        return ctx
    return replace(ctx, cfg=config_mod.replace(ctx.cfg, **{"grpo.generation_batch_size": gen}))


def model_summary(spec: ModelSpec) -> dict:
    return {"name": spec.name, "family": spec.family, "params": spec.params, "layers": spec.layers,
            "hidden": spec.hidden, "vocab": spec.vocab, "config": spec.source}
