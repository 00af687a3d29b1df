"""The plan's pictures: what one costs at the chosen settings (plan.json's ``pictures``) and the reasons' sentences.
Bytes and tokens; no torch. The terms themselves are ``planning/picture_memory.py``'s."""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from trainer.core.units import count, gib
from trainer.models import vision
from trainer.planning import picture_memory as pictures
from trainer.planning.context import Context, make_setup, need, with_loss
from trainer.planning.memory import Estimate, TrainSetup, estimate


def per_picture(ctx: Context, s: TrainSetup) -> tuple[Optional[int], dict]:
    """What one more picture per sample adds to the plan's peak (the GPU's, or host RAM on the CPU): its tokens
    through every text layer and the loss, its vision activations, their allocator slack, for the micro-batch; and
    where that lies in the plan's bar: each drawn component's share (the GPU's breakdown, or host RAM's on the CPU;
    bytes, largest first). The difference of two estimates: the sample as planned, and with one picture and its
    tokens fewer. (None, {}) when one picture's tokens fill the planned sequence (it is then the whole sequence's
    cost, not a picture's)."""
    tokens = ctx.pictures.picture.tokens
    if tokens >= s.seq_len or not s.pictures:
        return None, {}
    a, b = estimate(ctx.spec, s), estimate(ctx.spec, replace(s, pictures=s.pictures - 1, seq_len=s.seq_len - tokens))
    mine, less = (a.breakdown, b.breakdown) if ctx.device == "cuda" else (a.host_breakdown, b.host_breakdown)
    parts = {k: v - less.get(k, 0) for k, v in mine.items() if v - less.get(k, 0) > 0}
    return max(0, need(ctx, a) - need(ctx, b)), dict(sorted(parts.items(), key=lambda kv: -kv[1]))


def summary(ctx: Context, s: TrainSetup, est: Estimate) -> dict:
    """plan.json's ``pictures``: the pictures planned per sample and per picture (tokens, vision units and positions),
    where the figures come from, the processor's settings and data.image_max_pixels, what trains, and bytes: one
    picture's share of the peak, the vision tower's activations for the micro-batch, its trained parameters."""
    load = ctx.pictures
    if load is None:
        return {}
    full, adapter = pictures.trainable(ctx.spec, s)
    cost, parts = per_picture(ctx, s)
    return {"per_sample": load.per_sample, "tokens_per_picture": load.picture.tokens,
            "vision_units_per_picture": load.picture.units, "vision_positions_per_unit": load.picture.positions,
            "from_data": load.measured, "processor": vision.describe(load.processor),
            "processor_source": load.processor.source, "image_max_pixels": load.processor.cap_words,
            "train_vision": s.train_vision, "bytes_per_picture": cost,
            "bytes_per_picture_parts": parts,
            "vision_activation_bytes": est.breakdown.get("vision_activations", 0),
            "vision_forward_bytes": pictures.forward_bytes(ctx.spec, s),
            "vision_trained_params": full + adapter, "tokens_over_seq_len": over_seq_len(ctx),
            "suggested_image_max_pixels": suggested_cap(ctx) if over_seq_len(ctx) else None,
            "measured_tower": pictures.measured_activations(ctx.spec)}


def vision_note(spec, method) -> str:
    """What of a vision-language model's vision side trains (``method.train_vision``), in words."""
    v = spec.vision
    tower, projector = count(v["tower_params"]), count(v["projector_params"])
    bits = "their Linears in 4 bits (QLoRA)" if method.type == "qlora" else "in 16 bits"
    if method.train_vision == "none":
        return (f"the vision tower ({tower} parameters) and projector ({projector}) stay frozen, {bits}: no gradients "
                "or optimizer states, and no activations kept (method.train_vision: projector or all trains them)")
    if method.train_vision == "projector":
        how = "fully" if method.type == "full" else "fully, beside the adapters (PEFT's modules_to_save)"
        return f"the projector ({projector} parameters) trains {how}; the vision tower ({tower}) stays frozen"
    if method.type == "full":
        return f"the vision tower ({tower} parameters) and projector ({projector}) train fully"
    return (f"LoRA adapts the vision tower's blocks too ({tower} parameters frozen under the adapters); the projector "
            f"({projector}) trains fully beside them")


def over_seq_len(ctx: Context) -> bool:
    """Whether a sample's pictures alone could be longer than the planned sequence (the processor's largest
    pictures, not the data's measured ones)."""
    load = ctx.pictures
    return load is not None and not load.measured and load.per_sample * load.picture.tokens >= ctx.seq


def words(ctx: Context, s: TrainSetup, est: Estimate) -> list[str]:
    """The reasons' sentences about pictures (none for a text run)."""
    load = ctx.pictures
    if load is None:
        return []
    d = summary(ctx, s, est)
    what = {"none": "the vision tower and projector frozen (no activations, gradients or optimizer states)",
            "projector": f"the projector trained ({count(d['vision_trained_params'])} parameters)",
            "all": f"the vision tower and projector trained ({count(d['vision_trained_params'])} parameters)"}
    cost = f"a picture costs ≈{gib(d['bytes_per_picture'], 2)} at micro-batch {s.micro_batch}" \
        if d["bytes_per_picture"] is not None else "one picture fills the whole sequence"
    out = [f"{load.words}; {cost}, {what[s.train_vision]}" + (f"; vision activations {gib(d['vision_activation_bytes'])}"
                                                              if d["vision_activation_bytes"] else "")]
    if d["image_max_pixels"]:
        out.append(d["image_max_pixels"])
    if not d["measured_tower"]:
        out.append(f"what {ctx.spec.family}'s vision tower keeps per picture is not measured here: only its tokens "
                   "are counted")
    if d["tokens_over_seq_len"]:
        out.append(_over_words(ctx))
    return out


def suggested_cap(ctx: Context) -> Optional[int]:
    """The data.image_max_pixels that leaves half the planned sequence to text when a sample's pictures would fill it
    (Qwen: that many tokens' pixels; Idefics3/SmolVLM: one tile a picture); None where a cap cannot help (a
    fixed-size processor, or one tile already)."""
    load = ctx.pictures
    p, room = load.processor, max(1, ctx.seq // (2 * load.per_sample))
    if p.kind == "dynamic":
        return room * p.factor * p.factor
    if p.kind == "tiles" and p.longest_edge > p.tile:
        return p.tile * p.tile
    return None


def _over_words(ctx: Context) -> str:
    """A sample's pictures could fill the sequence: the cap that would leave half of it to text."""
    load, cap = ctx.pictures, suggested_cap(ctx)
    fix = f"set data.image_max_pixels to {cap:,} or less, or " if cap else ""
    return (f"{load.per_sample} picture(s) of up to {load.picture.tokens:,} tokens each fill data.seq_len {ctx.seq:,}: "
            f"{fix}raise data.seq_len")


def for_choice(ctx: Context, choice) -> Optional[dict]:
    """plan.json's ``pictures`` for a search's choice ({} for a text run)."""
    if ctx.pictures is None:
        return {}
    s = make_setup(with_loss(ctx, choice.loss_kernel), choice.micro, choice.ckpt, choice.ds, choice.offload,
                   choice.optimizer, choice.generation or None)
    return summary(ctx, s, choice.estimate)
