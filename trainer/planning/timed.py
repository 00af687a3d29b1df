"""The plan's decisions made by time (``planning.speed``, seconds per optimizer step from the card's published peak
and its PCIe link): gradient checkpointing against activation offload without it, and the tiled MLP against paging
the optimizer states to host RAM. Each keeps the saver that needs less only where the other is estimated
``OFFLOAD_MIN_GAIN`` faster (the estimates are rough), and says both times. Called by ``planning.search``. No torch.
"""
from __future__ import annotations

from typing import Optional

from trainer.config.placements import placement
from trainer.core.units import gib
from trainer.planning.context import Context, DsOption, make_setup, per_rank_batch
from trainer.planning.memory import Estimate
from trainer.planning.optimizer_memory import paging_bytes_per_step
from trainer.planning.search_space import Level, best_micro
from trainer.planning.speed import OFFLOAD_MIN_GAIN, offload_copies, pcie_seconds, step_seconds


def faster_untiled(ctx: Context, options: list, tried: list, i: int) -> tuple[int, Optional[str]]:
    """Where the tiled MLP was kept because without it the run needs its optimizer states paged to host RAM (a
    level further), and both fit: both timed (``planning.speed``: compute with the tiled MLP's extra forward against
    the paged states' PCIe copies per optimizer step), the untiled one kept only where estimated faster by
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
    t_tiled, t_plain = (_seconds_per_step(*tried[k][:2]) for k in (i, j))
    if t_tiled is None or t_plain is None:
        return i, None
    oi, oj = tried[i][2], tried[j][2]
    extra = placement(opt_j).saver or placement(opt_j).placed  # what the untiled run adds: the levels differ in it alone
    both = (f"without it the run fits only with {extra} ({gib(oj.need)}, ≈ {t_plain:.2f} s per optimizer step), "
            f"with it, without {extra} ({gib(oi.need)}, ≈ {t_tiled:.2f} s: each tile's forward runs again in backward); "
            "estimates from the card's published peak and its PCIe link")
    if t_plain < (1.0 - OFFLOAD_MIN_GAIN) * t_tiled:
        return j, f"tiled MLP off (speed.tiled_mlp: auto): {both}; the faster by more than the estimates' error is kept"
    return i, (f"tiled MLP on (speed.tiled_mlp: auto): {both}; one memory saver fewer is kept unless the other is "
               f"estimated at least {OFFLOAD_MIN_GAIN:.0%} faster (the rule checkpointing and activation offload "
               "are weighed by)")


def _seconds_per_step(ctx: Context, b) -> Optional[float]:
    """One optimizer step's estimated seconds for a search result: its micro-batches' compute or activation copies
    (``speed.step_seconds``), plus the paged states' PCIe copies (each state in and out, an upper bound)."""
    times = _step_time(ctx, b.micro, b.ckpt, *b.level, b.est)
    link = ctx.gpu.pcie_bytes_per_second if ctx.gpu is not None else None
    paged = paging_bytes_per_step(b.est.host_breakdown)
    if times is None or (paged and not link):
        return None
    return times["total"] * (per_rank_batch(ctx.cfg) // b.micro) + (pcie_seconds(paged, link) if paged else 0.0)


def recompute_or_offload(ctx: Context, level: Level, found: dict) -> tuple[Level, bool, dict, list[str]]:
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
