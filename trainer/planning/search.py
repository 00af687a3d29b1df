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

from dataclasses import dataclass, replace
from typing import Optional

from trainer import config as config_mod
from trainer.config.resolved import resolve_dtype
from trainer.config.loading import explicit_keys
from trainer.core import capabilities
from trainer.core.dotted import get_in
from trainer.core.units import count, gib
from trainer.models import catalog
from trainer.models.spec import ModelSpec, load_model_spec
from trainer.planning.context import (
    SMALL_TOKENS,
    Context,
    DsOption,
    family,
    fits,
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
from trainer.planning import fused_plan, kernels, lengths, loss_kernel, requirements, throughput
from trainer.planning.kernels import Variant
from trainer.planning.budget import usable_host_words
from trainer.planning.memory import Estimate, estimate, fragmentation_share
from trainer.planning.tiled_memory import tiles_mlp
from trainer.planning.reasons import reasons
from trainer.planning.saver_memory import margin_notes
from trainer.planning.savings import mask_reason, savings, savings_reasons
from trainer.planning.speed import OFFLOAD_MIN_GAIN, step_seconds


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
    """Activation offload as set, else off and then on (CUDA only: TRL offloads from the GPU to the host)."""
    v = ctx.cfg.speed.activation_offload
    if isinstance(v, bool):
        return [v]
    return [False, True] if ctx.device == "cuda" else [False]


def optimizer_options(ctx: Context) -> list[str]:
    """The configured optimizer, then 8-bit AdamW where the user allows approximate savings
    (``plan_allow_approximate``), did not choose the optimizer, trains all weights, and bitsandbytes can run (CUDA)."""
    c = ctx.cfg
    mine = c.training.optimizer if "training.optimizer" in explicit_keys(c) else None
    if mine or not c.plan_allow_approximate or ctx.device != "cuda" or c.method.type != "full" or \
            c.training.optimizer != "adamw":
        return [c.training.optimizer]
    return ["adamw", "adamw_8bit"]


Level = tuple[DsOption, bool, str]  # (DeepSpeed option, activation offload, optimizer)


def levels(ctx: Context) -> list[Level]:
    """The memory savers in the order they are tried: plain, activation offload, 8-bit AdamW (if allowed),
    then DeepSpeed's (its own optimizer: the configured optimizer, no activation offload unless set)."""
    out: list[Level] = []
    offload, optims = offload_options(ctx), optimizer_options(ctx)
    if fused_of(ctx):  # the step in backward: no DeepSpeed; each state placement, activation offload off then on
        return [((False, ctx.cfg.deepspeed.zero_stage, False, False), off, opt)
                for opt in fused_plan.placements(ctx) for off in offload]
    for ds in ds_options(ctx):
        if ds[0]:
            out.append((ds, offload[0] if len(offload) == 1 else False, optims[0]))
            continue
        out += [(ds, off, optims[0]) for off in offload]
        out += [(ds, offload[-1], opt) for opt in optims[1:]]
    return out


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
    optimizer: str = "adamw"
    savings: list = None  # what each memory saver in this choice saves (planning.savings)
    generation: int = 0  # GRPO: completions sampled at once per GPU (0: not GRPO)
    loss_kernel: str = "hf"  # the loss the run computes (planning.loss_kernel)


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
    choice = _search(fused_plan.context(ctx))
    choice.settings.update(fused_plan.settings(ctx, choice.micro, choice.optimizer))
    return choice


def _largest_fused_batch(ctx: Context) -> str:
    """The largest effective batch the fused step keeps exact here, in words (the planner never changes yours)."""
    per = per_rank_batch(ctx.cfg)
    lo, hi, best, one = 1, per - 1, None, None  # memory grows with the batch: bisect for the largest that fits
    while lo <= hi:
        m = (lo + hi) // 2
        choice = _search(fused_plan.context(ctx, m))
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
        one = _search(fused_plan.context(ctx, 1))
    at_one = f" (it would need {gib(one.peak)})" if one is not None else ""
    return f"with the optimizer step fused into backward not even an effective batch of 1 fits{at_one}"


def choice_level(choice: "Choice") -> Level:
    """The level a choice was made at."""
    return choice.ds, choice.offload, choice.optimizer


def _search(ctx: Context) -> Choice:
    """For each candidate loss kernel the layers' variant (tiled MLP, LoRA dropout: ``kernels``), then the loss kernel
    decided among the candidates' results (``loss_kernel``)."""
    candidates = loss_kernel.candidates(ctx.cfg, family(ctx), ctx.liger)
    best = {k: _best_variant(with_loss(ctx, k)) for k in candidates}
    outcomes = {k: o for k, (_, _, o, _) in best.items()}
    decision = loss_kernel.decide(ctx.cfg, outcomes, ctx.budget, gib, family(ctx), ctx.liger, ctx.device)
    vctx, b, _, words = best[decision.kernel]
    choice = _choice(vctx, b.micro, b.ckpt, b.level, b.est, b.found, b.gen, b.why)
    if fused_of(vctx) and vctx.cfg.method.type == "full":  # (a LoRA run may fuse its step too: no buffer to speak of)
        at = len(choice.reasons) - (choice.verdict != "fits")
        choice.reasons[at:at] = fused_plan.reasons(vctx, b.micro, b.ckpt, b.level, b.est)
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


OPTIMIZER_WORDS = {"paged_adamw_32bit": "fp32 AdamW states paged to host RAM", "adamw_8bit": "8-bit AdamW",
                   "paged_adamw_8bit": "8-bit AdamW states paged to host RAM"}


def level_words(level: Level) -> str:
    """The memory savers of a level in words ("" for none)."""
    (on, stage, opt_off, par_off), offload, optimizer = level
    words = []
    if offload:
        words.append("activation offload")
    if optimizer != "adamw" and not on:
        words.append(OPTIMIZER_WORDS[optimizer])
    if on:
        extra = " + parameter offload" if par_off else (" + optimizer offload" if opt_off else "")
        words.append(f"DeepSpeed ZeRO-{stage}{extra}")
    return ", ".join(words)


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
    moved = 2 * est_o.host_breakdown.get("offloaded_activations", 0) * (per // mb_o)
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


def verdict_of(ctx: Context, est: Estimate) -> str:
    if fits(ctx, est):
        return "fits"
    host_ok = ctx.device == "cpu" or est.host_ram_bytes <= ctx.host_budget
    return "tight" if host_ok and need(ctx, est) <= ctx.usable else "does_not_fit"


def _choice(ctx: Context, mb: int, ckpt: bool, level: Level, est: Estimate, found: dict, gen: int = 0,
            tradeoff: Optional[list] = None) -> Choice:
    ds, off, opt = level
    settings = _auto_settings(ctx.cfg, mb, ckpt, ds, off, opt, gen)
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


def _auto_settings(cfg, mb: int, ckpt: bool, ds: DsOption, offload: bool = False, optimizer: Optional[str] = None,
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
    out = _auto_settings(cfg, mb, ctx.device == "cuda", (False, cfg.deepspeed.zero_stage, False, False),
                         generation=min(generation_options(cfg, mb)))
    if cfg.speed.loss_kernel == "auto":
        out["speed.loss_kernel"] = loss_kernel.resolve_unplanned(cfg)
    return {**out, **kernels.resolve_unplanned(cfg)}


def model_summary(spec: ModelSpec) -> dict:
    return {"name": spec.name, "family": spec.family, "params": spec.params, "layers": spec.layers,
            "hidden": spec.hidden, "vocab": spec.vocab, "config": spec.source}


# -- alternatives: the nearest things that fit ---------------------------------------------------
def _variant(ctx: Context, changes: dict) -> Optional[Context]:
    try:
        cfg = config_mod.replace(ctx.cfg, **changes)
    except config_mod.ConfigError:
        return None
    return replace(Context.build(cfg, ctx.hardware, ctx.gpu, ctx.device, ctx.goal), liger=ctx.liger)


def _alt(ctx: Context, changes: dict, description: str) -> Optional[dict]:
    """An alternative: ``fits`` when its memory fits AND this machine can run it (``needs``: what it lacks, the
    verdict's rule: QLoRA on the CPU or without bitsandbytes is no alternative that fits, for any model)."""
    v = _variant(ctx, changes)
    if v is None or v.spec is None:
        return None
    choice = search(v)
    settings = dict(changes, **choice.settings)
    machine = config_mod.replace(v.cfg, device=ctx.device)
    needs = list(dict.fromkeys(r.needs for r in requirements.unmet(machine, ctx.hardware) if not r.every_method))
    return {"description": description, "settings": settings, "predicted_peak_bytes": choice.peak,
            "host_ram_needed_bytes": choice.estimate.host_ram_bytes, "fits": choice.verdict == "fits" and not needs,
            "needs": needs}


AUTO = {"training.micro_batch_size": "auto", "training.gradient_accumulation_steps": "auto",
        "speed.gradient_checkpointing": "auto"}


def _auto(ctx: Context) -> dict:
    """The batch-shaping values an alternative hands back to the planner (GRPO's generation batch too)."""
    if ctx.cfg.training.objective == "grpo":
        return {**AUTO, "grpo.generation_batch_size": "auto"}
    return dict(AUTO)


def alternatives(ctx: Context) -> list[dict]:
    """What would fit instead (fitting ones first): auto settings, full DeepSpeed offload
    (with the host RAM it needs), LoRA, QLoRA, a shorter sequence, a smaller model."""
    c, out = ctx.cfg, []
    no_ds = {"deepspeed.enabled": False, "deepspeed.offload_optimizer": False, "deepspeed.offload_params": False}
    mine = config_mod.to_dict(c)
    if any(get_in(mine, k) != "auto" for k in _auto(ctx)):
        words = "micro-batch, accumulation, checkpointing and the generation batch" if c.training.objective == "grpo" \
            else "micro-batch, accumulation and checkpointing"
        out.append(_alt(ctx, _auto(ctx), f"let the planner choose {words}"))
    if c.method.type == "full" and ctx.device == "cuda":
        out += _fused_alternatives(ctx)
        out.append(_zero3_offload(ctx))
    if c.method.type == "full":
        out.append(_alt(ctx, {**_auto(ctx), **no_ds, "method.type": "lora"}, f"LoRA (rank {c.method.lora_r}) instead of a full fine-tune"))
    if c.method.type == "qlora":  # 16-bit weights: more memory, but no bitsandbytes and no GPU needed
        out.append(_alt(ctx, {**_auto(ctx), "method.type": "lora"}, f"LoRA (rank {c.method.lora_r}) on 16-bit weights "
                                                                    "instead of QLoRA's 4-bit ones"))
    if c.method.type != "qlora" and ctx.device == "cuda":
        bnb = "" if capabilities.installed("bitsandbytes") else " (needs bitsandbytes: pip install bitsandbytes)"
        out.append(_alt(ctx, {**_auto(ctx), **no_ds, "method.type": "qlora"}, f"QLoRA: 4-bit base weights with LoRA adapters{bnb}"))
    out.append(_shorter(ctx))
    out.append(_smaller_model(ctx))
    alts = [a for a in out if a]
    return sorted(alts, key=lambda a: not a["fits"])


def _fused_alternatives(ctx: Context) -> list[Optional[dict]]:
    """The step fused into backward with its states paged to host RAM (fp32: exact; 8-bit: approximate), where
    the plan does not already use that placement and the fused step can run (``fused_plan.unavailable``)."""
    if fused_plan.unavailable(ctx) is not None or not capabilities.installed("bitsandbytes"):
        return []
    out = []
    for optimizer in ("paged_adamw_32bit", "paged_adamw_8bit"):
        changes = fused_plan.alternative_changes(ctx, optimizer)
        if all(get_in(config_mod.to_dict(ctx.cfg), k) == v for k, v in changes.items()):
            continue
        out.append(_alt(ctx, changes, fused_plan.alternative_words(optimizer)))
    return out


def _zero3_offload(ctx: Context) -> Optional[dict]:
    changes = {**_auto(ctx), "deepspeed.enabled": True, "deepspeed.zero_stage": 3, "deepspeed.offload_optimizer": True,
               "deepspeed.offload_params": True}
    if ctx.cfg.deepspeed.enabled is True and ctx.cfg.deepspeed.offload_params:
        return None
    alt = _alt(ctx, changes, "DeepSpeed ZeRO-3 offloading parameters and optimizer states to host RAM")
    if alt and not alt["fits"]:
        have = ctx.hardware.host.ram_available_bytes
        alt["description"] += (f": fits in VRAM only with {gib(alt['host_ram_needed_bytes'])} of host RAM "
                               f"({usable_host_words(have)})")
    return alt


def _shorter(ctx: Context) -> Optional[dict]:
    """The longest sequence below ``data.seq_len`` that fits, on the planner's one grid of lengths
    (``planning.lengths``, as ``plan --max-seq`` finds it), no longer than the model reads."""
    def fits(seq: int) -> Optional[dict]:
        alt = _alt(ctx, {**_auto(ctx), "data.seq_len": seq}, f"shorter sequences: data.seq_len {seq}")
        return alt if alt and alt["fits"] else None

    top = min(ctx.cfg.data.seq_len - 1, ctx.spec.max_positions or ctx.cfg.data.seq_len)
    return lengths.longest_fitting(fits, top)[1]


def _smaller_model(ctx: Context) -> Optional[dict]:
    """The largest real model of the same kind (causal or encoder-decoder; never a random-weight test
    architecture) smaller than this one that fits as configured. Its hub id is the source: real weights."""
    candidates = [(load_model_spec(arch), repo) for arch, repo in catalog.real_models(ctx.spec.encoder_decoder)]
    for spec, repo in sorted(candidates, key=lambda c: -c[0].params):
        if spec.params >= ctx.spec.params:
            continue
        alt = _alt(ctx, {**_auto(ctx), "model.source": repo, "model.architecture": None},
                   f"a smaller model: {repo} ({count(spec.params)} parameters)")
        if alt and alt["fits"]:
            return alt
    return None
