"""Saved activations of architectures without a hand-fitted formula, from the coefficients their structure record
measured (``trainer/worker/probes/saved_bytes.py``), in bytes. No torch.

A part's bytes at micro-batch b and sequence s are ``c + cs·s + b·(l·s + q·s²)``: c parameter-derived copies
(autocast's 16-bit weights), cs per position shared by the batch (RoPE tables, counted once per layer kind), l per
token, q per sample and position² (attention kernels or masks that keep s² terms). The record measured one typical
layer per kind and the first layer apart (under LoRA its input needs no gradient); sliding-window layers in both of
transformers' regimes (no mask below the window, an explicit mask from it on). LoRA's adapters keep their own
inputs: that term stays analytic (``adapters.activation_per_token``), as for the fitted families.
"""
from __future__ import annotations

from trainer.models.spec import LayerGroup, ModelSpec
from trainer.planning import adapters, packed_mask
from trainer.planning import picture_memory as pictures

FUSED_HEAD_PER_TOKEN = 16  # TRL's fused LM head: log Z and entropy (fp32) and the int64 target per token
CHUNK_TARGETS_PER_TOKEN = 8  # the chunked loss keeps the int64 targets


def setup_name(s) -> str:
    """Which measured setup a TrainSetup is: lora (LoRA/QLoRA's frozen base), fp32, amp (fp32 weights under 16-bit
    autocast) or bf16 (16-bit weights; fp16 has the same sizes)."""
    if s.method in ("lora", "qlora"):
        return "lora"
    if s.precision == "fp32":
        return "fp32"
    return "bf16" if s.weights_16bit else "amp"


def coefficients(spec: ModelSpec, s) -> dict:
    """The record's coefficients for this setup (its decoder layers with the MLP tiled where it runs tiled:
    ``TrainSetup.mlp_tiled``, which asks ``has_tiled``)."""
    coeff = spec.activations["setups"][setup_name(s)]
    if s.mlp_tiled(spec):
        return {**coeff, **spec.activations["tiled"][setup_name(s)]}
    return coeff


def has_tiled(spec: ModelSpec, s=None) -> bool:
    """The record measured the decoder layers with the worker's tiled MLP and norms (``speed.tiled_mlp``), for the
    setup of ``s`` (any setup when None)."""
    tiled = (spec.activations or {}).get("tiled") or {}
    return bool(tiled) if s is None else setup_name(s) in tiled


def mlp_per_token(spec: ModelSpec, s) -> float:
    """Bytes per token the typical layer keeps beyond a tiled MLP's (what one tile of it holds per token, its
    adapters' inputs included): the per-token coefficients measured without and with tiling, apart."""
    name = setup_name(s)
    g = max(reversed(spec.groups), key=lambda x: x.count)
    plain = spec.activations["setups"][name]["layers"][str(g.kind)][2]
    tiled = spec.activations["tiled"][name]["layers"][str(g.kind)][2]
    lora = adapters.mlp_adapter_per_token(s, g.linears) if s.method in ("lora", "qlora") else 0
    return max(0.0, plain - tiled) + lora


def evaluate(c: list, batch: int, seq: int, shared: bool = True) -> float:
    """Bytes of one part: ``c + cs·s + b·(l·s + q·s²)`` (``shared`` False leaves out what the batch shares)."""
    const, per_pos, per_tok, quad = c
    base = const + (per_pos * seq if shared else 0)
    return base + batch * (per_tok * seq + quad * seq * seq)


def _masked(g: LayerGroup, seq: int, coeff: dict) -> bool:
    """transformers builds an explicit sliding-window mask once the sequence reaches the window."""
    return g.type == "sliding_attention" and bool(g.window) and seq >= g.window and "masked" in coeff


def layer_bytes(spec: ModelSpec, s, g: LayerGroup, first: bool = False, shared: bool = True) -> float:
    """Bytes one layer of group ``g`` saves for the whole micro-batch (the first decoder layer when ``first``),
    with LoRA's adapter inputs and eager attention's s² terms where they apply. With pictures, Gemma 3's layers all
    keep an explicit mask ('pictures' coefficients); and when the projector or tower trains, the first layer's input
    carries gradients under LoRA too, so it saves what a typical layer does."""
    coeff = coefficients(spec, s)
    b, n = s.micro_batch, s.seq_len
    first = first and not (s.method in ("lora", "qlora") and pictures.vision_grads(s))
    masked = True  # measured with a mask in place: a packed block's adds nothing
    if pictures.pictures_masked(spec, s) and "pictures" in coeff:
        c = coeff["pictures_first"] if first else coeff["pictures"][str(g.kind)]
    elif _masked(g, n, coeff):
        c = coeff.get("masked_first") if first else coeff["masked"][str(g.kind)]
    else:
        c, masked = coeff["first"] if first else coeff["layers"][str(g.kind)], False
    out = evaluate(c, b, n, shared)
    if s.method in ("lora", "qlora") and s.precision == "fp32":
        out *= 2  # measured with a 16-bit base; an fp32 one keeps twice the bytes (approximation)
    return out + b * n * (_adapters(spec, s, g) + _eager_delta(spec, s, g)) + _packed(spec, s, g, masked)


def _packed(spec: ModelSpec, s, g: LayerGroup, masked: bool) -> int:
    """What a packed block's mask adds to an attention layer not measured with a mask (``packed_mask``); linear
    attention and convolution layers take no mask."""
    if masked or "attention" not in g.type or g.type == "linear_attention":
        return 0
    return packed_mask.per_layer_bytes(s, spec.heads * spec.head_dim, spec.kv_width)


def _adapters(spec: ModelSpec, s, g: LayerGroup) -> int:
    """Per token: the adapters' own saved inputs in one layer of ``g`` (memory's analytic term)."""
    if s.method not in ("lora", "qlora"):
        return 0
    return adapters.activation_per_token(s, g.linears, tiled=s.mlp_tiled(spec))


def _eager_delta(spec: ModelSpec, s, g: LayerGroup) -> int:
    """Per token: what eager attention keeps beyond the fused kernels (its fp32 and 16-bit softmax and the repeated
    K/V), when the run asks for eager on an architecture measured with SDPA (the fitted families' eager term)."""
    if s.attn != "eager" or not spec.supports_sdpa or "attention" not in g.type or g.type == "linear_attention":
        return 0
    width = s.activation_width
    a = spec.heads
    return (4 + width) * a * s.seq_len + 2 * width * max(0, spec.heads * spec.head_dim - spec.kv_width) - 4 * a


def layers_total(spec: ModelSpec, s) -> float:
    """All decoder layers: the first layer, then each group's typical layer × its count (the first group's one
    fewer); what the batch shares (RoPE tables) once per kind."""
    total = 0.0
    for i, g in enumerate(spec.groups):
        count = g.count - 1 if i == 0 else g.count
        if i == 0:
            total += layer_bytes(spec, s, g, first=True)
        if count:
            total += layer_bytes(spec, s, g, shared=i != 0) + (count - 1) * layer_bytes(spec, s, g, shared=False)
    return total


def head_bytes(spec: ModelSpec, s) -> float:
    """Embedding output, final norm and the head for this objective and loss: HF's loss as measured; the chunked
    loss, TRL's fused head (DPO/KTO) and GRPO's scored tokens keep the head's input (when the head trains) and
    their small per-token terms instead of the full-vocabulary log-softmax."""
    coeff = coefficients(spec, s)
    b, n = s.micro_batch, s.seq_len
    embed_norm = evaluate(coeff["embed"], b, n) + evaluate(coeff["norm"], b, n) + evaluate(coeff["after"], b, n)
    head_input = s.activation_width * spec.hidden if s.method == "full" else 0
    if s.objective == "grpo":
        return embed_norm
    if s.fused_head:
        return embed_norm + b * n * (head_input + FUSED_HEAD_PER_TOKEN)
    if not s.full_logits:  # the chunked or Liger loss: the head input's gradient, made in its forward, and targets
        return embed_norm + b * n * (s.activation_width * spec.hidden + CHUNK_TARGETS_PER_TOKEN)
    return embed_norm + evaluate(coeff["loss"], b, n)


def activation_bytes(spec: ModelSpec, s) -> dict:
    """``{"layers", "head", "recompute"}`` as ``memory.activation_bytes`` returns them (``s`` already carries
    DPO's chosen + rejected in its micro-batch). Checkpointing keeps each layer's input (16-bit, or fp32 with a
    wide residual stream) and rebuilds the largest layer during backward."""
    head = head_bytes(spec, s)
    if s.checkpointing:
        kept = spec.layers * s.micro_batch * s.seq_len * s.stream_width * spec.hidden
        recompute = max(layer_bytes(spec, s, g, shared=False) for g in spec.groups)
        return {"layers": int(kept), "head": int(head), "recompute": int(recompute)}
    return {"layers": int(layers_total(spec, s)), "head": int(head), "recompute": 0}
