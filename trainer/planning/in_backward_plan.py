"""The optimizer step fused into backward, as the planner plans it (``training.optimizer_in_backward``; the worker:
trainer/worker/loading/in_backward_step.py; the memory: ``optimizer_memory``).

When: a full fine-tune that does not fit with the separate step (a plan that fits without it stays as it was), or one
whose config asks for it. What it takes: one micro-batch per optimizer step (the whole per-GPU effective batch at
once: accumulation would need every gradient kept), no gradient clipping (``max_grad_norm: 0``: the global norm needs
every gradient at once), one GPU, no DeepSpeed, no fp16 loss scaling. Those rules and the settings that follow them
are written once in trainer/config/in_backward.py (the worker's cross-checks read them too). It never changes the
effective batch: where one micro-batch of it does not fit, the plan says the largest effective batch the fused step
keeps exact.

State placements, in the order tried (``placements``): fp32 states on the GPU, fp32 states paged to host RAM
(bitsandbytes' PagedAdamW32bit: exact), then — only under ``plan_allow_approximate`` — 8-bit states on the GPU and
paged. An explicit ``training.optimizer`` is the only placement tried.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from trainer import config as config_mod
from trainer.config import in_backward
from trainer.config.loading import explicit_keys
from trainer.config.placements import DEFAULT, PLACEMENTS, placement
from trainer.core import capabilities
from trainer.core.dotted import get_in
from trainer.core.units import LEAST_PRINTED, count, gib
from trainer.planning.context import Context, make_setup, need, per_rank_batch
from trainer.planning.memory import Estimate, estimate
from trainer.planning.optimizer_memory import gradient_bytes, largest_param, paging_bytes_per_step, state_words
from trainer.planning.speed import pcie_seconds

def unavailable(ctx: Context) -> Optional[str]:
    """Why the planner may not fuse the step for this config (None: it may). The user's own values are never
    overridden: explicit clipping, accumulation or micro-batch that the fused step cannot keep."""
    c, t = ctx.cfg, ctx.cfg.training
    mine = explicit_keys(c)
    if t.optimizer_in_backward is False:
        return "training.optimizer_in_backward is false"
    if ctx.spec is None or not in_backward.runs(c, ctx.precision):
        return "it runs for a full fine-tune (not GRPO) on one GPU, without DeepSpeed or fp16"
    if "training.max_grad_norm" in mine and t.max_grad_norm > 0:
        return f"your training.max_grad_norm {t.max_grad_norm} asks for clipping, which needs every gradient at once"
    per = per_rank_batch(c)
    if t.gradient_accumulation_steps not in ("auto", 1) or t.micro_batch_size not in ("auto", per):
        return "your micro-batch and accumulation split the effective batch over several micro-batches"
    return None


def placements(ctx: Context) -> list[str]:
    """Where the states may live, in the order tried: an explicit ``training.optimizer`` alone; else fp32 on the
    GPU, then paged (bitsandbytes, CUDA), then 8-bit (``plan_allow_approximate``)."""
    c = ctx.cfg
    chosen = "training.optimizer" in explicit_keys(c) or (c.training.optimizer_in_backward and c.training.optimizer != DEFAULT)
    if chosen or ctx.device != "cuda":  # (an alternative names its optimizer beside the fused step)
        return [c.training.optimizer]
    return [p.name for p in PLACEMENTS if (p.exact or c.plan_allow_approximate)
            and (p.package is None or capabilities.installed(p.package))]  # the table's order: exact ones first


def planned_context(ctx: Context, effective: Optional[int] = None) -> Context:
    """``ctx`` planning the fused step: one micro-batch of the per-GPU batch (``effective``: another effective
    batch, for the largest one that fits), accumulation 1."""
    changes: dict = {"training.gradient_accumulation_steps": 1}  # your micro-batch, if you set one, is the batch's
    if effective is not None:
        changes.update({"training.effective_batch_size": effective, "training.micro_batch_size": "auto"})
    cfg = config_mod.replace(ctx.cfg, **changes)
    return replace(ctx, cfg=cfg, in_backward=True)


def settings(ctx: Context, micro: int, optimizer: str) -> dict:
    """The values the fused step writes (those the user left to the planner): the step in backward, no clipping,
    the whole per-GPU batch in one micro-batch, the states' optimizer."""
    c, mine = ctx.cfg, explicit_keys(ctx.cfg)
    yours = config_mod.to_dict(c)
    out = {k: v for k, v in in_backward.changes(micro).items() if k != "training.max_grad_norm"
           and (k not in mine or get_in(yours, k) == "auto")}  # yours say so already
    if c.training.max_grad_norm > 0 and "training.max_grad_norm" not in mine:
        out["training.max_grad_norm"] = 0.0
    if optimizer != c.training.optimizer:
        out["training.optimizer"] = optimizer
    return out


def where_states_live(ctx: Context, optimizer: str, est: Estimate) -> str:
    """Where the states live, in the plan's numbers."""
    s = make_setup(ctx, 1, False, (False, 2, False, False), None, optimizer)
    what = state_words(s)
    if not placement(optimizer).paged:
        states = gib(est.breakdown.get("optimizer_states", 0))
        on = f"on the GPU ({states})" if ctx.device == "cuda" else f"in host RAM (training on the CPU): {states}"
        return f"optimizer states: {what} {on}"
    if s.paged_on_gpu:
        return (f"optimizer states: {what} in CUDA managed memory, planned on the GPU "
                f"({gib(est.breakdown.get('optimizer_states', 0))}): on Windows managed memory cannot oversubscribe "
                "the GPU (CUDA programming guide, unified memory on Windows), so nothing is paged out")
    host = est.host_breakdown.get("paged_optimizer_states", 0)
    words = (f"optimizer states: {what} paged to host RAM ({gib(host)} of host RAM in CUDA managed memory); the GPU "
             f"holds the states of the parameter being updated ({gib(est.breakdown.get('paged_states_working_set', 0))}"
             f", the largest parameter's)")
    link = ctx.gpu.pcie_bytes_per_second if ctx.gpu is not None else None
    if link:
        moved = paging_bytes_per_step(est.host_breakdown)
        words += (f"; at most {gib(moved)} cross PCIe per optimizer step (each state in and out), "
                  f"≈ {pcie_seconds(moved, link):.1f} s at ≈{link / 1e9:.0f} GB/s")
    return words


def in_words(ctx: Context, micro: int, ckpt: bool, level, est: Estimate) -> list[str]:
    """The fused step in words: what it saves against the separate step (same settings), the batch it keeps exact,
    clipping off, where the states live, what is approximate."""
    ds, off, opt = level
    fused = make_setup(ctx, micro, ckpt, ds, off, opt)
    separate = estimate(ctx.spec, replace(fused, in_backward=False))
    n = largest_param(ctx.spec)
    kept = sum(gradient_bytes(ctx.spec, fused).values())
    buffer = separate.breakdown["gradients"]
    largest = f"{count(n)} elements, with the fp32 copy of the part its norm is measured on"
    sizes = (f"the {gib(buffer)} gradient buffer becomes {gib(kept)} (the largest parameter's gradient, {largest})"
             if buffer >= LEAST_PRINTED else  # gib() would print 0.0 GiB → 0.0 GiB
             f"the gradient buffer (under {gib(LEAST_PRINTED, 2)} for this model) becomes the largest parameter's "
             f"gradient ({largest})")
    where = "peak" if ctx.device == "cuda" else "host RAM"  # the headline's number: need() (the CPU's is host RAM)
    out = [f"optimizer step fused into backward (training.optimizer_in_backward): each parameter is updated as soon "
           f"as its gradient is complete and that gradient is freed, so {sizes}; {where} "
           f"{gib(need(ctx, separate))} → {gib(need(ctx, est))}",
           f"effective batch {ctx.cfg.training.effective_batch_size} kept exact in one micro-batch of {micro} "
           f"(accumulation 1: the fused step cannot add gradients over micro-batches)",
           "gradient clipping off (training.max_grad_norm: 0): clipping by the global norm needs every gradient at "
           "once; the gradient norm is still measured and logged",
           where_states_live(ctx, opt, est)]
    if est.moments:
        out.append(moment_words(est))
    p = placement(opt)
    if p.eight_bit:
        out.append("approximate: 8-bit optimizer states (bitsandbytes; the embeddings' too, as torchtune's recipe) — updates differ "
                   "slightly from fp32 AdamW" + (" (plan_allow_approximate allows it)" if ctx.cfg.plan_allow_approximate
                                                  else " (your training.optimizer)"))
    elif p.package is not None:
        out.append("exact: bitsandbytes' fp32 AdamW gives PyTorch AdamW's update within fp32 rounding "
                   "(tests/test_optimizer_in_backward.py)")
    else:
        out.append("exact: the same AdamW update as the separate step")
    return out


MOMENT_WORDS = {"loss": "at the loss (the end of forward, every checkpoint and the loss's working memory held)",
                "layer": "in the last layer's backward (its recompute and the gradients in flight, every checkpoint "
                         "still held)",
                "end": "at the end of backward (the embedding's gradient)"}


def moment_words(est: Estimate) -> str:
    """Where the fused step peaks, and what its other moments hold (``in_backward_memory.fused_step_moments``)."""
    top = max(est.moments, key=est.moments.get)
    others = ", ".join(f"{name} {gib(v)}" for name, v in est.moments.items() if name != top)
    return (f"the fused step peaks {MOMENT_WORDS[top]}: {gib(est.moments[top])} beside the weights and states "
            f"(its other moments: {others}; each moment counts what is alive then)")


def alternative_changes(ctx: Context, optimizer: str) -> dict:
    """The config changes an alternative with the fused step and these states makes."""
    out = {**in_backward.changes(per_rank_batch(ctx.cfg)), "training.optimizer": optimizer,
           "speed.gradient_checkpointing": "auto", **in_backward.NO_DEEPSPEED}
    if "training.max_grad_norm" in explicit_keys(ctx.cfg):  # yours (0: unavailable refuses clipping) stays
        del out["training.max_grad_norm"]
    return out


def alternative_words(optimizer: str, at: str = "") -> str:
    """An alternative's description (the issue's words); ``at``: the effective batch it is offered at, in words."""
    p = placement(optimizer)
    tail = " — exact" if p.exact else " — approximate: 8-bit optimizer states"
    return f"full fine-tune with {p.placed} and the step fused into backward{at}{tail}"

