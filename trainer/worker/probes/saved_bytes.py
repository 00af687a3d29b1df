"""What one training forward saves for backward, measured with autograd itself on fake tensors (no memory, no
compute): per distinct decoder-layer kind, the embedding, the final norm and the head with HF's loss.

The model runs under ``FakeTensorMode`` as if on the CPU (so autocast and the CPU kernels' dispatch apply), at
three (micro-batch, sequence) points, which separate a constant (parameter-derived copies), a term linear in the
tokens and one quadratic in the sequence: ``bytes = c + b·(l·s + q·s²)``. Attention is the kernel a CUDA run uses:
``scaled_dot_product_attention`` is replaced by a stand-in that saves what flash / memory-efficient attention save
(q, k, v, the output in their (b, s, heads, d) layout, an fp32 log-sum-exp of b×heads×s, and a boolean mask
converted to the query's dtype with its last dimension padded to 16) — not the s² probabilities of the math path.
Sliding-window layers are measured in both of transformers' regimes: without a mask (sequence shorter than the
window, SDPA's ``is_causal``) and with one (the (b, 1, s, s) mask saved per layer, K/V repeated per head).

Setups: ``bf16`` (16-bit weights, no autocast), ``fp32``, ``amp`` (fp32 weights under bf16 autocast) and ``lora``
(a frozen 16-bit base whose every text Linear's output requires grad, as an adapter's would; the adapters' own
saved inputs are the planner's analytic term). Imports torch inside functions: worker side only.
"""
from __future__ import annotations

import contextlib

from trainer.core.errors import UserError

TOKENS = 256  # the measured sequence length; (1, 2·TOKENS) and (2, TOKENS) are the other points
KIND_ATTRS = ("layer_type", "attention_type", "sliding_window", "is_sliding", "use_rope", "is_causal", "block_type",
              "is_attention_layer")


def install_kernels() -> None:
    """Patch, for this (probe) process: SDPA → the flash stand-in on fake/meta tensors; packed-sequence detection
    off (a data-dependent check; the planner plans unpacked, unpadded batches); transformers' grouped matmul for
    MoE experts only in bf16 (as on CUDA; other dtypes take its fallback op, which saves the same tensors)."""
    import torch
    import torch.nn.functional as F
    import transformers.masking_utils as masking
    from transformers.integrations import moe

    real_sdpa = F.scaled_dot_product_attention

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if _is_real(q):
            return real_sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                             enable_gqa=enable_gqa)
        return _flash_function().apply(q, k, v, attn_mask)

    F.scaled_dot_product_attention = sdpa
    torch.nn.functional.scaled_dot_product_attention = sdpa
    masking.find_packed_sequence_indices = lambda position_ids: None
    can_use = moe._can_use_grouped_mm
    moe._can_use_grouped_mm = lambda inp, weight, offs: weight.dtype == torch.bfloat16 and can_use(inp, weight, offs)


def _is_real(t) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return not isinstance(t, FakeTensor) and t.device.type != "meta"


_FLASH = None


def _flash_function():
    """The autograd function standing in for CUDA's fused attention (forward only: the probe never runs backward)."""
    global _FLASH
    if _FLASH is None:
        import torch

        class FlashStandIn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v, mask):
                b, heads, s, _ = q.shape
                out = q.new_empty((b, s, heads, v.shape[-1])).transpose(1, 2)  # the fused kernels' output layout
                lse = torch.empty((b, heads, s), dtype=torch.float32, device=q.device)
                saved = [q, k, v, out, lse]
                if mask is not None:
                    if mask.dtype == torch.bool:  # SDPA converts it to an additive mask in q's dtype, padded to 16
                        mask = q.new_empty(mask.shape[:-1] + (-(-mask.shape[-1] // 16) * 16,))
                    saved.append(mask)
                ctx.save_for_backward(*saved)
                return out

            @staticmethod
            def backward(ctx, grad):
                raise RuntimeError("the flash stand-in is for measuring saved tensors only")

        _FLASH = FlashStandIn
    return _FLASH


@contextlib.contextmanager
def mask_regime(masked):
    """Inside: sliding-window layers get transformers' explicit mask (``masked`` True, the sequence reaches the window)
    or none (shorter than the window: SDPA's is_causal); full-attention layers as transformers decides. ``masked``
    'everywhere': every layer gets an explicit (b, 1, s, s) mask, as Gemma 3's do when a batch has pictures (its image
    tokens attend to each other both ways: ``token_type_ids``)."""
    import transformers.masking_utils as masking

    real = masking._ignore_causal_mask_sdpa

    def ignore(padding_mask, q_length, kv_length, q_offset, kv_offset, local_attention_size=None):
        if masked == "everywhere":
            return False
        if local_attention_size is not None:
            return not masked
        return real(padding_mask, q_length, kv_length, q_offset, kv_offset, local_attention_size)

    masking._ignore_causal_mask_sdpa = ignore
    try:
        yield
    finally:
        masking._ignore_causal_mask_sdpa = real


@contextlib.contextmanager
def flash_everywhere():
    """Inside: SDPA is the fused-kernel stand-in on real tensors too (the vision measurement runs on real CPU tensors,
    ``vision_bytes``; the CPU's own SDPA would pick kernels a CUDA run does not)."""
    import torch
    import torch.nn.functional as F

    before = F.scaled_dot_product_attention

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        return _flash_function().apply(q, k, v, attn_mask)

    F.scaled_dot_product_attention = sdpa
    torch.nn.functional.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = before
        torch.nn.functional.scaled_dot_product_attention = before


def layer_kind(layer, layer_type) -> tuple:
    """What makes two decoder layers save the same tensors: class, config layer type, parameter names and shapes,
    and the per-layer attributes transformers switches on (sliding window, RoPE on/off, mixer kind)."""
    params = tuple((n, tuple(p.shape)) for n, p in layer.named_parameters())
    attrs = tuple((path, a, repr(getattr(mod, a))) for path, mod in layer.named_modules() for a in KIND_ATTRS
                  if isinstance(getattr(mod, a, None), (bool, int, str, type(None))) and hasattr(mod, a))
    return type(layer).__name__, layer_type, params, attrs


def trim_to_kinds(model, layers, text_config, kinds: list):
    """Keep the first decoder layer and one typical layer per distinct kind (the first of the kind after layer 0,
    if any), in order; the config follows (layer count and per-layer types), so transformers' own forward runs
    them. The first layer is kept apart because under LoRA its input needs no gradient and it saves less.
    Returns (the new layer list, for each kind in order of appearance its position in that list)."""
    import torch

    order = list(dict.fromkeys(kinds))
    reps = [next((i for i, k in enumerate(kinds) if k == kind and i > 0), 0) for kind in order]
    keep = sorted(set([0, *reps]))
    kept = torch.nn.ModuleList([layers[i] for i in keep])
    for parent in model.modules():
        for name, child in list(parent.named_children()):
            if child is layers:
                setattr(parent, name, kept)
    text_config.num_hidden_layers = len(keep)
    if isinstance(getattr(text_config, "layer_types", None), list):
        text_config.layer_types = [text_config.layer_types[i] for i in keep]
    return kept, [keep.index(r) for r in reps]


@contextlib.contextmanager
def attribution(start: str, marks):
    """Yields a one-item list naming where a forward is: ``start`` until a module of ``marks`` runs, then for each
    ``(module, inside, after)`` ``inside`` while that module runs and ``after`` once it returned."""
    where, hooks = [start], []
    for module, inside, after in marks:
        hooks.append(module.register_forward_pre_hook(lambda m, a, name=inside: where.__setitem__(0, name)))
        hooks.append(module.register_forward_hook(lambda m, a, o, name=after: where.__setitem__(0, name)))
    try:
        yield where
    finally:
        for h in hooks:
            h.remove()


def _text_parts(layers, final_norm) -> list:
    """The text model's marks for ``attribution``: 'embed' before the layers, each kept layer's position, 'after'
    between, 'norm' (the final norm), 'loss' (the LM head and HF's loss)."""
    marks = [(layer, i, "after") for i, layer in enumerate(layers)]
    return marks + ([(final_norm, "norm", "loss")] if final_norm is not None else [])


def saved_by_part(model, layers, final_norm, batch: int, seq: int, autocast: bool, frozen_ids=()) -> dict:
    """Bytes of the distinct non-parameter storages one forward with labels saves, by part ('embed', each kept
    layer's position, 'norm' (final norm), 'loss' (LM head and HF's loss); 'after' is anything between)."""
    import torch

    params = {p.untyped_storage()._cdata for p in model.parameters()} | set(frozen_ids)
    seen: dict = {}
    vocab = model.get_output_embeddings().weight.shape[0]
    ids = torch.randint(0, vocab, (batch, seq))
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with attribution("embed", _text_parts(layers, final_norm)) as where:
        def pack(t):
            st = t.untyped_storage()
            if st._cdata not in params and st._cdata not in seen and st.nbytes():
                seen[st._cdata] = (where[0], st.nbytes())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), amp:
            model(input_ids=ids, labels=ids, use_cache=False)
    out: dict = {}
    for part, n in seen.values():
        out[part] = out.get(part, 0) + n
    return out


def points_at(tokens: int) -> tuple:
    """The four (micro-batch, sequence) points measured around ``tokens``."""
    return (1, tokens), (1, 2 * tokens), (2, tokens), (2, 2 * tokens)


def fit(points: dict, parts, tokens: int = TOKENS) -> dict:
    """Per part: [c, cs, l, q] with bytes = c + cs·s + b·(l·s + q·s²), from the four measured (b, s) points around
    ``tokens`` (``points_at``): c in bytes (parameter-derived copies), cs in bytes per position shared by the batch
    (RoPE tables), l in bytes per token and q in bytes per sample and position²."""
    s = tokens
    out = {}
    for part in parts:
        m11, m12, m21, m22 = (points[p].get(part, 0) for p in points_at(tokens))
        p1, p2 = m21 - m11, m22 - m12  # one sample's bytes at s and 2s
        q = (p2 - 2 * p1) / (2 * s * s)
        lin = (p1 - q * s * s) / s
        s1, s2 = m11 - p1, m12 - p2  # what the batch shares at s and 2s
        cs = (s2 - s1) / s
        out[part] = [round(s1 - cs * s, 3), round(cs, 4), round(lin, 4), round(q, 6)]
    return out


def _points(model, layers, final_norm, autocast: bool, frozen_ids=(), tokens: int = TOKENS) -> dict:
    return {(b, n): saved_by_part(model, layers, final_norm, b, n, autocast, frozen_ids) for b, n in points_at(tokens)}


def tiled_tokens(hidden: int) -> int:
    """The sequence the tiled layers are measured around: two tiles at the smallest point (the worker's tiled MLP
    runs a block untiled up to ``hidden`` tokens: ``trainer/worker/kernels/tiled_mlp.py``), a multiple of 64."""
    return -(-2 * hidden // 64) * 64


@contextlib.contextmanager
def adapter_outputs(modules):
    """Inside: the outputs of ``modules`` (Linears) require grad, as a LoRA adapter's sum would (the base stays
    frozen); yields the storage ids of the stand-in parameters (not activations)."""
    import torch

    hooks, ids = [], []
    for module in modules:
        zero = torch.zeros((), dtype=module.weight.dtype, requires_grad=True)
        ids.append(zero.untyped_storage()._cdata)
        hooks.append(module.register_forward_hook(lambda m, a, out, z=zero: out + z))
    try:
        yield ids
    finally:
        for h in hooks:
            h.remove()


def measure(model, layers, final_norm, lora_names: set, sliding: bool, reps: list, pictures_masked: bool = False) -> dict:
    """``{"setups": coefficients per setup and part (``fit``): 'first' (the first decoder layer), 'layers' (one typical
    layer per kind, by kind position in ``reps``), 'embed', 'norm', 'loss'; 'masked' holds the kinds' coefficients
    with sliding-window masks in place (only when ``sliding``), 'pictures' with masks in every layer (only when
    ``pictures_masked``: Gemma 3 with pictures); "tiled": the layers' coefficients of the 16-bit setups with the MLP
    and norms tiled (``_measure_tiled``; absent where the worker cannot tile them)}``. ``model`` is a 16-bit meta
    model; it and an fp32 copy are materialised as fake CPU tensors (fake parameters cannot be cast in place, so the
    copy is cast on the meta device)."""
    import copy

    from torch._subclasses.fake_tensor import FakeTensorMode

    names = {id(m): n for n, m in model.named_modules()}
    layers_name, norm_name = names[id(layers)], names.get(id(final_norm))
    wide = copy.deepcopy(model).float()
    parts = ["embed", "norm", "loss", "after", *range(len(layers))]
    regimes = (False,) + ((True,) if sliding else ()) + (("everywhere",) if pictures_masked else ())
    out: dict = {}
    with FakeTensorMode(allow_non_fake_inputs=True):
        for m, setups in ((model, ("bf16", "lora")), (wide, ("fp32", "amp"))):
            m.to_empty(device="cpu")
            m.train()
            kept = m.get_submodule(layers_name)
            norm = m.get_submodule(norm_name) if norm_name is not None else None
            for setup in setups:
                for p in m.parameters():
                    p.requires_grad_(setup != "lora")
                out[setup] = _measure_setup(m, kept, norm, setup, lora_names, regimes, parts, reps)
        tiled = _measure_tiled(model, layers_name, norm_name, lora_names, regimes, reps)
    return {"setups": out, **({"tiled": tiled} if tiled else {})}


REGIME_KEYS = {True: ("masked", "masked_first"), "everywhere": ("pictures", "pictures_first")}
TILED_SETUPS = ("bf16", "lora")  # the 16-bit setups a long sequence is planned with tiled layers
TILED_KEYS = ("first", "layers", "masked", "masked_first", "pictures", "pictures_first")


def _measure_tiled(model, layers_name: str, norm_name, lora_names: set, regimes, reps: list) -> dict:
    """The decoder layers' coefficients ('first', 'layers', and the masked ones) of the 16-bit setups with the
    worker's own tiled MLP and norms installed (``trainer.worker.kernels.tiled_mlp``), measured around
    ``tiled_tokens``; {} where the worker cannot tile this architecture (its refusal is the worker's too)."""
    from trainer.worker.kernels import tiled_mlp

    try:
        tiled_mlp.install(model)
    except UserError:
        return {}
    kept = model.get_submodule(layers_name)
    norm = model.get_submodule(norm_name) if norm_name is not None else None
    tokens = tiled_tokens(model.config.get_text_config(decoder=True).hidden_size)
    out = {}
    for setup in TILED_SETUPS:
        for p in model.parameters():
            p.requires_grad_(setup != "lora")
        full = _measure_setup(model, kept, norm, setup, lora_names, regimes, list(range(len(kept))), reps, tokens)
        out[setup] = {k: v for k, v in full.items() if k in TILED_KEYS}
    return out


def _measure_setup(model, layers, final_norm, setup: str, lora_names: set, regimes, parts, reps,
                   tokens: int = TOKENS) -> dict:
    autocast = setup == "amp"
    names = lora_names if setup == "lora" else set()
    result = {}
    for masked in regimes:
        with mask_regime(masked), adapter_outputs(m for n, m in model.named_modules() if n in names) as ids:
            coeffs = fit(_points(model, layers, final_norm, autocast, ids, tokens), parts, tokens)
        kinds = {str(k): coeffs[pos] for k, pos in enumerate(reps)}
        if masked:
            key, first = REGIME_KEYS[masked]
            result[key] = kinds
            result[first] = coeffs[0]
        else:
            result.update({k: coeffs[k] for k in ("embed", "norm", "loss", "after") if k in coeffs})
            result["first"], result["layers"] = coeffs[0], kinds
    return result
