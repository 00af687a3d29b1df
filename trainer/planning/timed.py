"""The plan's decisions made by time (``speed.optimizer_step``, the plan's one time model: seconds per optimizer step
from the card's published peak, each micro-batch's utilisation and the card's PCIe link): gradient checkpointing
against activation offload without it, and the tiled MLP against paging the optimizer states to host RAM. Each keeps
the saver that needs less only where the other is estimated ``OFFLOAD_MIN_GAIN`` faster (the estimates are rough),
and says both times. Called by ``planning.search``. No torch.
"""
from __future__ import annotations

from typing import Optional

from trainer.config.placements import placement
from trainer.core.units import gib
from trainer.planning.context import Context, DsOption, make_setup
from trainer.planning.memory import Estimate
from trainer.planning.search_space import Level, best_micro
from trainer.planning.speed import OFFLOAD_MIN_GAIN, optimizer_step, peak_flops
from trainer.planning.speed import ranking_seconds as ranking


def faster_untiled(ctx: Context, options: list, tried: list, i: int) -> tuple[int, Optional[str]]:
    """Where the tiled MLP was kept because without it the run needs its optimizer states paged to host RAM (a
    level further), and both fit: both timed (``speed.optimizer_step``: compute with the tiled MLP's extra forward
    against the paged states' PCIe copies per optimizer step), the untiled one kept only where estimated faster by
    ``OFFLOAD_MIN_GAIN`` (the estimates are rough). (the index to keep, the reason in words; None where there is
    nothing to weigh or a time is unknown)."""
    chosen = options[i]
    if not chosen.tiled_mlp or ctx.cfg.speed.tiled_mlp != "auto":
        return i, None
    j = next((k for k, v in enumerate(options) if not v.tiled_mlp and v.lora_dropout == chosen.lora_dropout), None)
    if j is None or not (tried[i][2].fits and tried[j][2].fits):
        return i, None
    (ds_i, off_i, opt_i), (ds_j, off_j, opt_j) = tried[i][1].level, tried[j][1].level
    if (ds_i, off_i) != (ds_j, off_j) or opt_i == opt_j:  # only the states' placement is weighed by time: activation
        return i, None  # offload measured 2.6x slower than its estimate on an H100 (test_long_context_plan)
    times = [_step_time(vctx, b.micro, b.ckpt, *b.level, b.est) for vctx, b, _ in (tried[i], tried[j])]
    if None in times:
        return i, None
    t_tiled, t_plain = (t["total"] for t in times)
    oi, oj = tried[i][2], tried[j][2]
    extra = placement(opt_j).saver or placement(opt_j).placed  # what the untiled run adds: the levels differ in it alone
    both = (f"without it the run fits only with {extra} ({gib(oj.need)}, ≈ {t_plain:.2f} s per optimizer step), "
            f"with it, without {extra} ({gib(oi.need)}, ≈ {t_tiled:.2f} s: each tile's forward runs again in backward); "
            "estimates from the card's published peak, each micro-batch's utilisation and its PCIe link")
    if t_plain < (1.0 - OFFLOAD_MIN_GAIN) * t_tiled:
        return j, f"tiled MLP off (speed.tiled_mlp: auto): {both}; the faster by more than the estimates' error is kept"
    return i, (f"tiled MLP on (speed.tiled_mlp: auto): {both}; one memory saver fewer is kept unless the other is "
               f"estimated at least {OFFLOAD_MIN_GAIN:.0%} faster (the rule checkpointing and activation offload "
               "are weighed by)")


def recompute_or_offload(ctx: Context, level: Level, found: dict) -> tuple[Level, bool, dict, list[str]]:
    """Checkpointing fits; so may activation offload without it. Keep the faster per optimizer step (recompute
    against PCIe time, ``speed.optimizer_step``): (level, checkpointing, found, the reason in words)."""
    ds, _, opt = level
    other = best_micro(ctx, False, ds, None, True, opt)
    if other is None:
        return level, True, found, []
    (mb_c, est_c, _), (mb_o, est_o, _) = found[True], other
    t_c, t_o = (_step_time(ctx, mb, ck, ds, off, opt, est) for mb, ck, off, est in
                ((mb_c, True, False, est_c), (mb_o, False, True, est_o)))
    if t_c is None or t_o is None:
        return level, True, found, [f"gradient checkpointing on rather than activation offload (which also fits, at "
                                    f"micro-batch {mb_o}): the time of offload's PCIe copies cannot be estimated for "
                                    f"this GPU (its PCIe link or its compute peak is not known), so the planner keeps "
                                    f"the one that needs no host RAM"]
    step_c, step_o = t_c["total"], t_o["total"]
    link = ctx.gpu.pcie_bytes_per_second  # unknown only where nothing is moved (optimizer_step needs it otherwise)
    words = (f"checkpointing's recompute ≈ {step_c:.2f} s per optimizer step (micro-batch {mb_c}) against activation "
             f"offload without checkpointing ≈ {step_o:.2f} s (micro-batch {mb_o}: {gib(t_o['offloaded'])} over PCIe"
             + (f" at ≈{link / 1e9:.0f} GB/s" if link else "") + f", compute {t_o['compute']:.2f} s); "
             "estimates from the card's published peak, each micro-batch's utilisation and its PCIe link")
    if step_o < (1.0 - OFFLOAD_MIN_GAIN) * step_c:
        return (ds, True, opt), False, {False: other}, [f"gradient checkpointing off, activation offload instead: {words}"]
    return level, True, found, [f"gradient checkpointing on rather than activation offload: {words}"]


def _step_time(ctx: Context, mb: int, ckpt: bool, ds: DsOption, off: bool, opt: str, est: Estimate) -> Optional[dict]:
    """One optimizer step's time estimate for these settings (``speed.optimizer_step`` on the planned card), None when
    unknown."""
    s = make_setup(ctx, mb, ckpt, ds, off, opt)
    link = ctx.gpu.pcie_bytes_per_second if ctx.gpu is not None else None
    return optimizer_step(ctx.spec, s, est, ctx.gpu.name if ctx.gpu else None, link) or None


def card_of(ctx: Context) -> tuple:
    """(name, PCIe link) of the card a plan is timed on; (None, None) on the CPU."""
    card = ctx.gpu if ctx.device == "cuda" else None
    return (card.name, card.pcie_bytes_per_second) if card is not None else (None, None)


def ranking_seconds(ctx: Context, setup, est: Estimate) -> float:
    """Seconds per optimizer step of ``setup`` by the plan's one time model (``speed.ranking_seconds``)."""
    return ranking(ctx.spec, setup, est, *card_of(ctx))


def checkpointing_pays(ctx: Context, found: dict, level: Level) -> tuple[bool, Optional[dict]]:
    """Whether the search turns gradient checkpointing on at ``level``, where ``found`` holds what fits with it off
    and on: off (one memory saver fewer) unless only it fits, or checkpointing's larger micro-batch is estimated
    ``OFFLOAD_MIN_GAIN`` faster per optimizer step by the one time model (its recompute against the card kept busier:
    the rule activation offload and the tiled MLP are weighed by). (the choice, {False: s, True: s} where both were
    timed, else None). A card without a known peak (the CPU) gains nothing by the micro-batch: off."""
    if False not in found:
        return True, None
    if True not in found or found[True][0] <= found[False][0] or peak_flops(card_of(ctx)[0]) is None:
        return False, None
    times = {}
    for ck in (False, True):
        mb, est, gen = found[ck]
        times[ck] = ranking_seconds(ctx, make_setup(ctx, mb, ck, *level, gen or None), est)
    return times[True] < (1.0 - OFFLOAD_MIN_GAIN) * times[False], times
