"""A decoder layer with its position-wise blocks tiled (``speed.tiled_mlp``): what it keeps for backward, and what one
tile holds while its backward recomputes it (bytes). No torch.

The worker (``trainer/worker/kernels/tiled_mlp.py``) runs each layer's MLP and norms over tiles of ⌈b·s / h⌉ tokens;
each keeps only its 16-bit input. The hand-fitted families with Llama's layout are planned by
``tiled_layer_per_token``; every other architecture by its structure record's tiled coefficients
(``measured.has_tiled``), measured around the worker's own tiling.
"""
from __future__ import annotations

from trainer.models.spec import ModelSpec
from trainer.planning import adapters, measured

# ``s`` below is a ``memory.TrainSetup`` (not imported: memory imports this module).

# Hand-fitted families whose decoder layer is Llama's (RMSNorm before attention and before a gated MLP), for which
# ``tiled_layer_per_token`` holds; other architectures are planned tiled from their measured records.
LLAMA_LAYOUT_FAMILIES = frozenset({"llama", "mistral", "qwen2"})


def tiles_mlp(spec: ModelSpec, s=None) -> bool:
    """Whether the planner can plan this model's layers with the MLP tiled (for setup ``s``): a hand-fitted family
    with Llama's layout in 16 bits (bf16 weights, or a frozen base), or a record that measured its tiled layers
    (``measured.has_tiled``). Never a MoE that adds its router's auxiliary loss (``output_router_logits: true``): a
    tile's router logits run without autograd, so the worker refuses to tile it."""
    if spec.encoder_decoder or spec.router_aux_loss:
        return False
    if not spec.fitted:
        return measured.has_tiled(spec, s)
    sixteen = s is None or s.method in ("lora", "qlora") or s.weight_width == 2
    return spec.family in LLAMA_LAYOUT_FAMILIES and sixteen


def tiled_layer_per_token(spec: ModelSpec, s) -> int:
    """Bytes per token one decoder layer saves with its position-wise blocks tiled (``trainer/worker/kernels``
    tiles the MLP and both RMSNorms, each keeping only its 16-bit input): the layer's input, the residual after
    attention and the MLP's input (2·h each); q, k, v and the attention's output (2 bytes each) with SDPA's fp32
    log-sum-exp; with trained Linears also the normed input the q/k/v projections keep; over a frozen base the
    adapters' inputs outside the MLP (``adapters.activation_per_token``). Measured with saved-tensor hooks around
    the worker's own tiling (tests/test_long_context_memory.py)."""
    h, hkv, a, q = spec.hidden, spec.kv_width, spec.heads, spec.heads * spec.head_dim
    per = 6 * h + 4 * q + 4 * hkv + 4 * a
    if s.method in ("lora", "qlora"):
        per += adapters.activation_per_token(s, spec.typical_linears, tiled=True)
    else:
        per += 2 * h
    if s.attn == "eager":
        per += 6 * a * s.seq_len + 4 * (q - hkv) - 4 * a
    return per


def tiled_input_bytes(spec: ModelSpec, s) -> int:
    """The layer input a tiled layer keeps (its first norm's input), bytes for the micro-batch: under checkpointing
    that is the checkpoint itself (held, or brought back, as the checkpoints are), so the recompute leaves it out."""
    if not s.mlp_tiled(spec):
        return 0
    return 2 * s.micro_batch * s.seq_len * spec.hidden


def mlp_per_token(spec: ModelSpec, s) -> int:
    """Bytes per token a gated MLP's own operations keep for backward, beyond its input (which a tiled MLP keeps
    instead): the gate's output (kept by the activation), the activation's and the up projection's outputs (kept by
    their product) and, when the Linears train, the product (down's input): 6·I bytes over a frozen base, 8·I in
    16 bits, 16·I in fp32 (autocast over fp32 weights keeps 16-bit copies: 8·I)."""
    inter = spec.intermediate
    if s.method in ("lora", "qlora"):
        return 6 * inter
    return 4 * s.activation_width * inter


def mlp_tile_tokens(tokens: int, hidden: int) -> int:
    """Tokens in one tile of a tiled block: the micro-batch's ``tokens`` (b·s, flattened) split into
    ⌈tokens / hidden⌉ equal tiles, as the worker splits them (``tiled_mlp.tile_rows``; DeepSpeed's TiledMLP rule)."""
    tiles = max(1, -(-tokens // hidden))
    return -(-tokens // tiles)


def mlp_tile_bytes(spec: ModelSpec, s) -> int:
    """What one tile of a tiled MLP holds while its backward recomputes it (bytes): the tile's input and the MLP's
    intermediates and adapter inputs for the tile's tokens (``mlp_per_token``, ``adapters.mlp_adapter_per_token``)."""
    if not s.mlp_tiled(spec):
        return 0
    tile = mlp_tile_tokens(s.micro_batch * s.sequences_per_sample * s.seq_len, spec.hidden)
    width = s.activation_width
    if not spec.fitted:
        return int(tile * (measured.mlp_per_token(spec, s) + width * spec.hidden))
    lora = adapters.mlp_adapter_per_token(s, spec.typical_linears) if s.method in ("lora", "qlora") else 0
    return tile * (mlp_per_token(spec, s) + lora + width * spec.hidden)
