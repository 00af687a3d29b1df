"""What packing several documents into one sequence costs attention (bytes). No torch.

A packed block carries ``position_ids`` that restart at each document (``trainer/worker/datapipe``); transformers
(``masking_utils.find_packed_sequence_indices``) then keeps the documents apart with a full block-diagonal mask of
b × 1 × s × s booleans, built once per forward and handed to every layer (the checkpointed layers keep it for their
recompute). SDPA turns a boolean mask into an additive one in the query's dtype, its last dimension padded to a
multiple of 16, at each call, and its memory-efficient kernel keeps that for backward; with a mask transformers
repeats K and V to every query head (``use_gqa_in_sdpa`` is off on CUDA with a mask), and SDPA keeps those copies.
Eager attention adds one 16-bit float mask to its scores (its s² softmax terms are planned already).
FlashAttention-2 takes the documents' boundaries from ``position_ids`` (varlen) and keeps no mask. A block of one
document (position_ids 0..s-1) needs no mask; with packing, blocks that straddle a boundary do, so a packed run
is planned with the mask: at 48k tokens it is 2.25 GiB of booleans plus 4.5 GiB per layer that keeps its bias.
"""
from __future__ import annotations


def applies(s) -> bool:
    """Packed blocks put a block-diagonal mask in attention (not under FlashAttention-2's varlen path)."""
    return bool(getattr(s, "packed_mask", False)) and s.attn != "flash_attention_2"


def shared_bytes(s) -> int:
    """The mask built once per forward for the micro-batch: booleans for SDPA, a 16-bit (fp32) float mask for eager
    attention."""
    if not applies(s):
        return 0
    cells = s.micro_batch * s.sequences_per_sample * s.seq_len * s.seq_len
    return cells * (s.activation_width if s.attn == "eager" else 1)


def per_layer_bytes(s, q_width: int, kv_width: int) -> int:
    """What one SDPA attention layer keeps beyond the unmasked kernel for the micro-batch: the additive bias (the
    last dimension padded to 16) and K and V repeated to every query head (q_width − kv_width more values each)."""
    if not applies(s) or s.attn == "eager":
        return 0
    width = s.activation_width
    b, n = s.micro_batch * s.sequences_per_sample, s.seq_len
    return b * n * (-(-n // 16) * 16) * width + b * n * 2 * width * max(0, q_width - kv_width)
