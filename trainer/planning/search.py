"""The planner's search: the fastest settings that fit, and the nearest thing that fits when
nothing does. Preference (goal "fastest"): no DeepSpeed, then activation offload (CUDA), then 8-bit
AdamW (only with ``plan_allow_approximate``), then ZeRO sharding (several GPUs), then optimizer
offload, then parameter offload; within each, checkpointing off before on; within that, the largest
micro-batch that divides the per-GPU batch (so the effective batch is exact); for GRPO, at that
micro-batch, the largest generation batch whose sampling phase fits too. The loss kernel is weighed around
all of that: the search runs once per candidate kernel (``loss_kernel.candidates``: Liger alone where it runs, else
HF's loss and the chunked loss) and ``loss_kernel.decide`` picks, with the plan's one time model
(``speed.optimizer_step``), and says why.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from trainer.config.placements import placement
from trainer.core.units import gib
from trainer.planning.choice import Choice, choice_level, make_choice
from trainer.planning.context import (
    Context,
    family,
    generation_options,
    make_setup,
    micro_options,
    need,
    dropout_of,
    in_backward_of,
    per_rank_batch,
    tiled_of,
    with_loss,
    with_variant,
)
from trainer.planning import in_backward_plan, kernels, loss_kernel, speed
from trainer.planning.kernels import Variant
from trainer.planning.memory import Estimate, estimate
from trainer.planning.search_space import (
    Level,
    best_micro,
    ckpt_options,
    level_words,
    levels,
    offload_options,
)
from trainer.planning.tiled_memory import tiles_mlp
from trainer.planning import timed as timed_choices


@dataclass
class _Best:
    """One kernel's search result before reasons: the level (its index in ``levels``), micro-batch, checkpointing,
    estimate, what each checkpointing option found, GRPO's generation batch; ``fits`` False: the least memory."""
    index: int
    level: Level
    micro: int
    ckpt: bool
    est: Estimate
    found: dict
    gen: int
    fits: bool
    why: Optional[list] = None  # checkpointing against activation offload in words (``timed.recompute_or_offload``)


def search(ctx: Context) -> Choice:
    """The fastest fitting settings, or the smallest-memory ones with verdict does_not_fit. A full fine-tune that
    does not fit with the separate optimizer step is searched again with the step fused into backward
    (``in_backward_plan``), which the plan keeps when it fits; a config that asks for the fused step gets it. Where the
    answer does not fit and the step can be fused, the reasons say the largest effective batch the fused step keeps
    exact in one micro-batch (``Choice.largest_in_backward``), whether the fused step came from the planner or from you."""
    why_not = in_backward_plan.unavailable(ctx)
    if ctx.cfg.training.optimizer_in_backward is True and why_not is None:
        return _with_largest_in_backward(ctx, _in_backward(ctx))
    choice = _search(ctx)
    if choice.verdict == "fits" or why_not is not None:
        return choice
    fused = _in_backward(ctx)
    rank = {"fits": 0, "tight": 1, "does_not_fit": 2}
    if (rank[fused.verdict], fused.peak) < (rank[choice.verdict], choice.peak):  # fits, else nearer to fitting
        choice = fused
    return _with_largest_in_backward(ctx, choice)


def _in_backward(ctx: Context) -> Choice:
    """The search with the step fused into backward: one micro-batch of the whole per-GPU batch."""
    choice = _search(in_backward_plan.planned_context(ctx))
    choice.settings.update(in_backward_plan.settings(ctx, choice.micro, choice.optimizer))
    return choice


def _with_largest_in_backward(ctx: Context, choice: Choice) -> Choice:
    """``choice``, where it does not fit, with the largest fused effective batch in its reasons and numbers."""
    if choice.verdict == "fits":
        return choice
    best, one = largest_in_backward_batch(ctx)
    if best is not None:
        choice.largest_in_backward = (best[0], best[1].peak)
    at = len(choice.reasons) - 1  # before the verdict's sentence
    choice.reasons[at:at] = [_largest_in_backward_words(ctx, best, one or (choice if per_rank_batch(ctx.cfg) == 1 else None))]
    return choice


def largest_in_backward_batch(ctx: Context) -> tuple[Optional[tuple[int, Choice]], Optional[Choice]]:
    """The largest effective batch below this config's that fits with the step fused into backward (one
    micro-batch of it), with its choice, or None; and where none does, the choice at effective batch 1 (None when
    the batch is 1 already: the config's own choice is that one). Memory grows with the batch: a bisection."""
    per = per_rank_batch(ctx.cfg)
    lo, hi, best, one = 1, per - 1, None, None
    while lo <= hi:
        m = (lo + hi) // 2
        choice = _search(in_backward_plan.planned_context(ctx, m))
        if choice.verdict == "fits":
            lo, best = m + 1, (m, choice)
        else:
            hi, one = m - 1, (choice if m == 1 else one)
    if best is None and one is None and per > 1:
        one = _search(in_backward_plan.planned_context(ctx, 1))
    return best, (None if best is not None else one)


def _largest_in_backward_words(ctx: Context, best: Optional[tuple[int, Choice]], one: Optional[Choice]) -> str:
    """The largest fused effective batch in words (the planner never changes yours), naming where the states live:
    'not even 1 fits' holds for the placements tried, not for the ones the alternatives offer."""
    if best is not None:
        m, choice = best
        return (f"with the optimizer step fused into backward, the largest effective batch that fits in one "
                f"micro-batch is {m} (peak {gib(choice.peak)}; {level_words(choice_level(choice)) or 'no other saver'}): "
                f"set training.effective_batch_size: {m} to train that way (the planner keeps your "
                f"{ctx.cfg.training.effective_batch_size})")
    if one is None:
        return "with the optimizer step fused into backward not even an effective batch of 1 fits"
    tried = [placement(o).placed for o in in_backward_plan.placements(ctx)]
    places = " or ".join(tried) if len(tried) < 3 else ", ".join(tried[:-1]) + " or " + tried[-1]
    return (f"with the optimizer step fused into backward and {places}, not even an effective batch of 1 fits "
            f"(the nearest: {gib(one.peak)} with {placement(one.optimizer).placed})")


def _search(ctx: Context) -> Choice:
    """For each candidate loss kernel the layers' variant (tiled MLP, LoRA dropout: ``kernels``), then the loss kernel
    decided among the candidates' results (``loss_kernel``)."""
    candidates = loss_kernel.candidates(ctx.cfg, family(ctx), ctx.liger)
    best = {k: _best_variant(with_loss(ctx, k)) for k in candidates}
    outcomes = {k: o for k, (_, _, o, _) in best.items()}
    decision = loss_kernel.decide(ctx.cfg, outcomes, ctx.budget, gib, family(ctx), ctx.liger, ctx.device)
    vctx, b, _, words = best[decision.kernel]
    choice = make_choice(vctx, b.micro, b.ckpt, b.level, b.est, b.found, b.gen, b.why)
    if in_backward_of(vctx) and vctx.cfg.method.type == "full":  # (a LoRA run may fuse its step too: no buffer to speak of)
        at = len(choice.reasons) - (choice.verdict != "fits")
        choice.reasons[at:at] = in_backward_plan.in_words(vctx, b.micro, b.ckpt, b.level, b.est)
    at = min(2, len(choice.reasons))
    choice.reasons[at:at] = ([decision.why] if decision.why else []) + words
    if ctx.cfg.speed.loss_kernel == "auto":
        choice.settings["speed.loss_kernel"] = decision.kernel
    choice.settings.update(kernels.auto_settings(ctx.cfg, Variant(tiled_of(vctx), dropout_of(vctx))))
    choice.loss_kernel = decision.kernel
    return choice


def can_tile(ctx: Context) -> bool:
    """The planner can plan this run's MLP tiled (``tiled_memory.tiles_mlp``; supervised training)."""
    return ctx.spec is not None and ctx.cfg.training.objective == "sft" and tiles_mlp(ctx.spec)


def _best_variant(ctx: Context) -> tuple[Context, "_Best", loss_kernel.Outcome, list[str]]:
    """The search under each layer variant (``kernels.variants``, cheapest first, stopping once nothing can do
    better) and the one ``kernels.choose`` keeps: (its context, result, outcome, the reasons for it in words)."""
    options = kernels.variants(ctx.cfg, can_tile(ctx))
    tried = []
    for v in options:
        vctx = with_variant(ctx, v)
        b = _best(vctx)
        tried.append((vctx, b, _outcome(vctx, b)))
        if kernels.best_possible(tried[-1][2], max(micro_options(ctx.cfg))):
            break
    i = kernels.choose([t[2] for t in tried])
    i, timed = timed_choices.faster_untiled(ctx, options, tried, i)
    vctx, b, o = tried[i]
    words = kernels.why(ctx.cfg, options[i], {v: t[2] for v, t in zip(options, tried)}, gib, ctx.budget, ctx.usable)
    return vctx, b, o, (words if timed is None else [w for w in words if not w.startswith("tiled MLP on")] + [timed])


def _best(ctx: Context) -> _Best:
    """The first level (in ``levels`` order) where something fits, or the least memory we could try."""
    for index, (ds, off, opt) in enumerate(levels(ctx)):
        found = {ck: best_micro(ctx, ck, ds, None, off, opt) for ck in ckpt_options(ctx)}
        found = {ck: v for ck, v in found.items() if v}
        if not found:
            continue
        ckpt = timed_choices.checkpointing_pays(ctx, found, (ds, off, opt))[0]
        mb, est, gen = found[ckpt]
        level, why = (ds, off, opt), []
        if ckpt and not off and True in offload_options(ctx) and False in ckpt_options(ctx):  # both are the planner's
            level, ckpt, found, why = timed_choices.recompute_or_offload(ctx, level, found)
            mb, est, gen = found[ckpt]
        return _Best(index, level, mb, ckpt, est, found, gen, True, why)
    # nothing fits: report the least memory we could try
    mb = min(micro_options(ctx.cfg))
    gen = min(generation_options(ctx.cfg, mb))
    scored = [(estimate(ctx.spec, make_setup(ctx, mb, ck, *lvl, gen or None)), i, lvl, ck)
              for i, lvl in enumerate(levels(ctx)) for ck in ckpt_options(ctx)]
    host_ok = [s for s in scored if s[0].host_ram_bytes <= ctx.host_budget] or scored
    est, index, lvl, ck = min(host_ok, key=lambda s: need(ctx, s[0]))
    return _Best(index, lvl, mb, ck, est, {}, gen, False)


def _outcome(ctx: Context, b: _Best) -> loss_kernel.Outcome:
    """One kernel's (and layer variant's) search result as ``loss_kernel`` weighs it; its speed is trained tokens per
    second of an optimizer step by the plan's one time model (``speed.ranking_seconds`` on the planned card)."""
    setup = make_setup(ctx, b.micro, b.ckpt, *b.level, b.gen or None)
    ds, off, opt = b.level
    seconds = timed_choices.ranking_seconds(ctx, setup, b.est)
    step_tokens = per_rank_batch(ctx.cfg) * setup.sequences_per_sample * setup.seq_len
    return loss_kernel.Outcome(kernel=setup.loss_kernel, fits=b.fits, level=b.index, savers=level_words(b.level),
                               micro=b.micro, ckpt=b.ckpt, need=need(ctx, b.est),
                               speed=step_tokens / seconds,
                               tokens=b.micro * setup.sequences_per_sample * setup.seq_len,
                               zero3=bool(ds[0] and ds[1] == 3),
                               busy=speed.busy_share(ctx.spec, setup, timed_choices.card_of(ctx)[0]))
