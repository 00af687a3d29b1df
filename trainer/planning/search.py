"""The planner's search: the fastest settings that fit, and the nearest thing that fits when
nothing does. Preference (goal "fastest"): no DeepSpeed, then activation offload (CUDA), then 8-bit
AdamW (only with ``plan_allow_approximate``), then ZeRO sharding (several GPUs), then optimizer
offload, then parameter offload; within each, checkpointing off before on; within that, the largest
micro-batch that divides the per-GPU batch (so the effective batch is exact); for GRPO, at that
micro-batch, the largest generation batch whose sampling phase fits too. The loss kernel is weighed around
all of that: the search runs once per candidate kernel (``loss_kernel.candidates``: Liger alone where it runs, else
HF's loss and the chunked loss) and ``loss_kernel.decide`` picks, with the throughput estimate, and says why.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from trainer.core.units import gib
from trainer.planning.choice import Choice, choice_level, make_choice
from trainer.planning.context import (
    SMALL_TOKENS,
    Context,
    DsOption,
    family,
    generation_options,
    make_setup,
    micro_options,
    need,
    dropout_of,
    fused_of,
    per_rank_batch,
    tiled_of,
    with_loss,
    with_variant,
)
from trainer.planning import fused_plan, kernels, loss_kernel, throughput
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
from trainer.planning.speed import OFFLOAD_MIN_GAIN, offload_copies, step_seconds


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
    why: Optional[list] = None  # checkpointing against activation offload in words (``_recompute_or_offload``)


def search(ctx: Context) -> Choice:
    """The fastest fitting settings, or the smallest-memory ones with verdict does_not_fit. A full fine-tune that
    does not fit with the separate optimizer step is searched again with the step fused into backward
    (``fused_plan``), which the plan keeps when it fits; a config that asks for the fused step gets it."""
    why_not = fused_plan.unavailable(ctx)
    if ctx.cfg.training.optimizer_in_backward is True and why_not is None:
        return _fused(ctx)
    choice = _search(ctx)
    if choice.verdict == "fits" or why_not is not None:
        return choice
    fused = _fused(ctx)
    rank = {"fits": 0, "tight": 1, "does_not_fit": 2}
    if (rank[fused.verdict], fused.peak) < (rank[choice.verdict], choice.peak):  # fits, else nearer to fitting
        choice = fused
    if choice.verdict != "fits":
        at = len(choice.reasons) - 1  # before the verdict's sentence
        choice.reasons[at:at] = [_largest_fused_batch(ctx)]
    return choice


def _fused(ctx: Context) -> Choice:
    """The search with the step fused into backward: one micro-batch of the whole per-GPU batch."""
    choice = _search(fused_plan.planned_context(ctx))
    choice.settings.update(fused_plan.settings(ctx, choice.micro, choice.optimizer))
    return choice


def _largest_fused_batch(ctx: Context) -> str:
    """The largest effective batch the fused step keeps exact here, in words (the planner never changes yours)."""
    per = per_rank_batch(ctx.cfg)
    lo, hi, best, one = 1, per - 1, None, None  # memory grows with the batch: bisect for the largest that fits
    while lo <= hi:
        m = (lo + hi) // 2
        choice = _search(fused_plan.planned_context(ctx, m))
        if choice.verdict == "fits":
            lo, best = m + 1, (m, choice)
        else:
            hi, one = m - 1, (choice if m == 1 else one)
    if best is not None:
        m, choice = best
        return (f"with the optimizer step fused into backward, the largest effective batch that fits in one "
                f"micro-batch is {m} (peak {gib(choice.peak)}; {level_words(choice_level(choice)) or 'no other saver'}): "
                f"set training.effective_batch_size: {m} to train that way (the planner keeps your "
                f"{ctx.cfg.training.effective_batch_size})")
    if one is None and per > 1:
        one = _search(fused_plan.planned_context(ctx, 1))
    at_one = f" (it would need {gib(one.peak)})" if one is not None else ""
    return f"with the optimizer step fused into backward not even an effective batch of 1 fits{at_one}"


def _search(ctx: Context) -> Choice:
    """For each candidate loss kernel the layers' variant (tiled MLP, LoRA dropout: ``kernels``), then the loss kernel
    decided among the candidates' results (``loss_kernel``)."""
    candidates = loss_kernel.candidates(ctx.cfg, family(ctx), ctx.liger)
    best = {k: _best_variant(with_loss(ctx, k)) for k in candidates}
    outcomes = {k: o for k, (_, _, o, _) in best.items()}
    decision = loss_kernel.decide(ctx.cfg, outcomes, ctx.budget, gib, family(ctx), ctx.liger, ctx.device)
    vctx, b, _, words = best[decision.kernel]
    choice = make_choice(vctx, b.micro, b.ckpt, b.level, b.est, b.found, b.gen, b.why)
    if fused_of(vctx) and vctx.cfg.method.type == "full":  # (a LoRA run may fuse its step too: no buffer to speak of)
        at = len(choice.reasons) - (choice.verdict != "fits")
        choice.reasons[at:at] = fused_plan.in_words(vctx, b.micro, b.ckpt, b.level, b.est)
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
    vctx, b, o = tried[i]
    words = kernels.why(ctx.cfg, options[i], {v: t[2] for v, t in zip(options, tried)}, gib, ctx.budget)
    return vctx, b, o, words


def _best(ctx: Context) -> _Best:
    """The first level (in ``levels`` order) where something fits, or the least memory we could try."""
    for index, (ds, off, opt) in enumerate(levels(ctx)):
        found = {ck: best_micro(ctx, ck, ds, None, off, opt) for ck in ckpt_options(ctx)}
        found = {ck: v for ck, v in found.items() if v}
        if not found:
            continue
        ckpt = _pick_ckpt(ctx, found)
        mb, est, gen = found[ckpt]
        level, why = (ds, off, opt), []
        if ckpt and not off and True in offload_options(ctx) and False in ckpt_options(ctx):  # both are the planner's
            level, ckpt, found, why = _recompute_or_offload(ctx, level, found)
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
    setup = make_setup(ctx, b.micro, b.ckpt, *b.level, b.gen or None)
    ds, off, opt = b.level
    return loss_kernel.Outcome(kernel=setup.loss_kernel, fits=b.fits, level=b.index, savers=level_words(b.level),
                               micro=b.micro, ckpt=b.ckpt, need=need(ctx, b.est),
                               speed=throughput.relative_speed(ctx.spec, setup),
                               tokens=b.micro * setup.sequences_per_sample * setup.seq_len,
                               zero3=bool(ds[0] and ds[1] == 3))


def _recompute_or_offload(ctx: Context, level: Level, found: dict) -> tuple[Level, bool, dict, list[str]]:
    """Checkpointing fits; so may activation offload without it. Keep the faster per optimizer step (recompute
    against PCIe time, ``planning.speed``): (level, checkpointing, found, the reason in words)."""
    ds, _, opt = level
    other = best_micro(ctx, False, ds, None, True, opt)
    if other is None:
        return level, True, found, []
    per = per_rank_batch(ctx.cfg)
    (mb_c, est_c, _), (mb_o, est_o, _) = found[True], other
    t_c, t_o = (_step_time(ctx, mb, ck, ds, off, opt, est) for mb, ck, off, est in
                ((mb_c, True, False, est_c), (mb_o, False, True, est_o)))
    if t_c is None or t_o is None:
        return level, True, found, [f"gradient checkpointing on rather than activation offload (which also fits, at "
                                    f"micro-batch {mb_o}): the time of offload's PCIe copies cannot be estimated for "
                                    f"this GPU (its PCIe link or its compute peak is not known), so the planner keeps "
                                    f"the one that needs no host RAM"]
    step_c, step_o = t_c["total"] * (per // mb_c), t_o["total"] * (per // mb_o)
    moved = offload_copies(est_o.host_breakdown.get("offloaded_activations", 0)) * (per // mb_o)
    link = ctx.gpu.pcie_bytes_per_second  # unknown only where nothing is moved (step_seconds needs it otherwise)
    words = (f"checkpointing's recompute ≈ {step_c:.2f} s per optimizer step (micro-batch {mb_c}) against activation "
             f"offload without checkpointing ≈ {step_o:.2f} s (micro-batch {mb_o}: {gib(moved)} over PCIe"
             + (f" at ≈{link / 1e9:.0f} GB/s" if link else "") + f", compute {t_o['compute'] * (per // mb_o):.2f} s); "
             "estimates from the card's published peak and its PCIe link")
    if step_o < (1.0 - OFFLOAD_MIN_GAIN) * step_c:
        return (ds, True, opt), False, {False: other}, [f"gradient checkpointing off, activation offload instead: {words}"]
    return level, True, found, [f"gradient checkpointing on rather than activation offload: {words}"]


def _step_time(ctx: Context, mb: int, ckpt: bool, ds: DsOption, off: bool, opt: str, est: Estimate) -> Optional[dict]:
    """One micro-batch's time estimate for these settings (``planning.speed.step_seconds``), None when unknown."""
    s = make_setup(ctx, mb, ckpt, ds, off, opt)
    link = ctx.gpu.pcie_bytes_per_second if ctx.gpu is not None else None
    times = step_seconds(ctx.spec, s, ctx.gpu.name if ctx.gpu else None, link,
                         est.host_breakdown.get("offloaded_activations", 0))
    return times or None


def _pick_ckpt(ctx: Context, found: dict) -> bool:
    """Checkpointing off unless its micro-batch is tiny and checkpointing allows 4× more."""
    if False not in found:
        return True
    if True in found and found[False][0] * ctx.seq < SMALL_TOKENS and found[True][0] >= 4 * found[False][0]:
        return True
    return False
