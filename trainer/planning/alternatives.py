"""The plan's alternatives: the nearest things that fit when the config does not (auto batch shaping, the step fused
into backward with paged states, ZeRO-3 offload, LoRA, QLoRA, a shorter sequence, a smaller model), each searched
by ``planning.search`` and judged by ``planning.requirements`` as the verdict is.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from trainer import config as config_mod
from trainer.config.in_backward import NO_DEEPSPEED
from trainer.config.placements import PLACEMENTS
from trainer.core import capabilities
from trainer.core.dotted import get_in
from trainer.core.units import count, gib
from trainer.models import catalog
from trainer.models.spec import load_model_spec
from trainer.planning import in_backward_plan, lengths, requirements
from trainer.planning.budget import usable_host_words
from trainer.planning.choice import Choice
from trainer.planning.context import Context
from trainer.planning.search import search


def _variant(ctx: Context, changes: dict) -> Optional[Context]:
    try:
        cfg = config_mod.replace(ctx.cfg, **changes)
    except config_mod.ConfigError:
        return None
    return replace(Context.build(cfg, ctx.hardware, ctx.gpu, ctx.device, ctx.goal), liger=ctx.liger)


def _alt(ctx: Context, changes: dict, description: str) -> Optional[dict]:
    """An alternative: ``fits`` when its memory fits AND this machine can run it (``needs``: what it lacks, the
    verdict's rule: QLoRA on the CPU or without bitsandbytes is no alternative that fits, for any model)."""
    return _alt_and_choice(ctx, changes, description)[0]


def _alt_and_choice(ctx: Context, changes: dict, description: str) -> tuple[Optional[dict], Optional[Choice]]:
    """``_alt`` with the search's choice for it (None, None: the changes make no config or no known model)."""
    v = _variant(ctx, changes)
    if v is None or v.spec is None:
        return None, None
    choice = search(v)
    settings = dict(changes, **choice.settings)
    machine = config_mod.replace(v.cfg, device=ctx.device)
    needs = list(dict.fromkeys(r.needs for r in requirements.unmet(machine, ctx.hardware) if not r.every_method))
    host = choice.estimate.host_ram_bytes
    if choice.verdict != "fits" and v.device == "cuda" and host > v.host_budget:  # host RAM, not VRAM, is what is short
        description += f": needs {gib(host)} of host RAM ({usable_host_words(ctx.hardware.host.ram_available_bytes)})"
    return {"description": description, "settings": settings, "predicted_peak_bytes": choice.peak,
            "host_ram_needed_bytes": host, "fits": choice.verdict == "fits" and not needs, "needs": needs}, choice


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
    mine = config_mod.to_dict(c)
    if any(get_in(mine, k) != "auto" for k in _auto(ctx)):
        words = "micro-batch, accumulation, checkpointing and the generation batch" if c.training.objective == "grpo" \
            else "micro-batch, accumulation and checkpointing"
        out.append(_alt(ctx, _auto(ctx), f"let the planner choose {words}"))
    if c.method.type == "full" and ctx.device == "cuda":
        out += _in_backward_alternatives(ctx)
        out.append(_zero3_offload(ctx))
    if c.method.type == "full":
        out.append(_alt(ctx, {**_auto(ctx), **NO_DEEPSPEED, "method.type": "lora"}, f"LoRA (rank {c.method.lora_r}) instead of a full fine-tune"))
    if c.method.type == "qlora":  # 16-bit weights: more memory, but no bitsandbytes and no GPU needed
        out.append(_alt(ctx, {**_auto(ctx), "method.type": "lora"}, f"LoRA (rank {c.method.lora_r}) on 16-bit weights "
                                                                    "instead of QLoRA's 4-bit ones"))
    if c.method.type != "qlora" and ctx.device == "cuda":
        bnb = "" if capabilities.installed("bitsandbytes") else " (needs bitsandbytes: pip install bitsandbytes)"
        out.append(_alt(ctx, {**_auto(ctx), **NO_DEEPSPEED, "method.type": "qlora"}, f"QLoRA: 4-bit base weights with LoRA adapters{bnb}"))
    out.append(_shorter(ctx))
    out.append(_smaller_model(ctx))
    alts = [a for a in out if a]
    return sorted(alts, key=lambda a: not a["fits"])


def _in_backward_alternatives(ctx: Context) -> list[Optional[dict]]:
    """The step fused into backward with its states paged to host RAM (fp32: exact; 8-bit: approximate), where
    the plan does not already use that placement and the fused step can run (``in_backward_plan.unavailable``)."""
    if in_backward_plan.unavailable(ctx) is not None:
        return []
    out = []
    for optimizer in (p.name for p in PLACEMENTS if p.paged and capabilities.installed(p.package)):
        changes = in_backward_plan.alternative_changes(ctx, optimizer)
        if all(get_in(config_mod.to_dict(ctx.cfg), k) == v for k, v in changes.items()):
            continue
        alt, choice = _alt_and_choice(ctx, changes, in_backward_plan.alternative_words(optimizer))
        if alt is not None and not alt["fits"] and not alt["needs"] and choice.largest_in_backward is not None:
            alt = _at_largest_batch(ctx, changes, optimizer, choice.largest_in_backward[0]) or alt
        out.append(alt)
    return out


def _at_largest_batch(ctx: Context, changes: dict, optimizer: str, batch: int) -> Optional[dict]:
    """The fused alternative at the largest effective batch it keeps exact in one micro-batch (the one-click must
    never end in "does not fit"; your effective batch changes only where you take this alternative, and it says so)."""
    mine = ctx.cfg.training.effective_batch_size
    smaller = {**changes, "training.effective_batch_size": batch,
               "training.micro_batch_size": batch}  # one micro-batch of it: the fused step runs on one GPU
    return _alt(ctx, smaller, in_backward_plan.alternative_words(
        optimizer, f" at effective batch {batch} (yours: {mine}; the largest that fits in one micro-batch)"))


def _zero3_offload(ctx: Context) -> Optional[dict]:
    changes = {**_auto(ctx), "deepspeed.enabled": True, "deepspeed.zero_stage": 3, "deepspeed.offload_optimizer": True,
               "deepspeed.offload_params": True}
    if ctx.cfg.deepspeed.enabled is True and ctx.cfg.deepspeed.offload_params:
        return None
    return _alt(ctx, changes, "DeepSpeed ZeRO-3 offloading parameters and optimizer states to host RAM")


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
