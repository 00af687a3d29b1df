"""Saved activations of encoder-decoder models (T5 / FLAN-T5), bytes. No torch.

Fitted on what autograd saves (saved-tensor hooks, tests/test_preference_memory.py) in HF's T5 with
dropout 0.1 (FLAN-T5's), gated-GELU FF, on the CPU: 24 shapes varying d_model, d_ff, heads, d_kv, layers,
vocabulary, batch and both sequence lengths; the fit's worst error was 0.2%. Per token, per layer:

- encoder layer: self-attention (q, k, v, o inputs: ``inner`` = heads × d_kv wide), its fp32 softmax, dropout
  mask and dropped probabilities (12 bytes per score: 12·a·s per token), the RMS norms (fp32 statistics),
  the gated-GELU FF (GELU's tanh pieces, the product, its dropout) and the sub-layers' dropout masks;
- decoder layer: the same for causal self-attention, plus cross-attention — its query/output inputs, its
  scores against every encoder position (12·a·s_enc per decoder token), and the K/V it projects from the
  encoder output (8·inner per encoder token, per decoder layer);
- each stack: embedding dropout, final norm; the head: the log-softmax over the vocabulary per target token.

Dropout masks were measured on the CPU, where they are as wide as the data; on CUDA they are bool, so the
estimate is a little high there (conservative). LoRA uses the full fine-tune's terms (frozen Linears keep
fewer inputs: an over-estimate, not fitted). Checkpointing keeps each layer's input plus one layer rebuilt.
"""
from __future__ import annotations

# (h, ff, inner, scores) bytes per token of one layer; wide = fp32 weights or fp32 residual stream
ENCODER = {"wide": (32, 32, 16, 12), "16bit": (24, 16, 14, 12)}
DECODER = {"wide": (49, 32, 24, 12), "16bit": (37, 16, 20, 12)}
CROSS_KV_PER_ENCODER_TOKEN = 8  # × inner, per decoder layer (K and V projected from the encoder output)
STACK_PER_TOKEN = {"wide": 20, "16bit": 14}  # × h: embedding dropout, final norm (each stack)
HEAD_PER_TOKEN = {"wide": 4, "16bit": 2}  # × vocab: the loss's log-softmax, per target token
BUCKET_BYTES = 8  # int64 relative-position buckets: s² per stack (shared by the batch)


def seq2seq_activation_bytes(spec, s) -> dict:
    """``{"layers", "head", "recompute"}`` like ``memory.activation_bytes``, for an encoder-decoder with input
    and target each ``s.seq_len`` tokens (the worker cuts both to seq_len)."""
    kind = "16bit" if s.weight_width == 2 else "wide"
    h, ff, a = spec.hidden, spec.intermediate, spec.heads
    inner = spec.heads * spec.head_dim
    n, seq = s.micro_batch * s.seq_len, s.seq_len
    enc = n * _layer(ENCODER[kind], h, ff, inner, a * seq)
    dec = n * (_layer(DECODER[kind], h, ff, inner, a * seq) + DECODER[kind][3] * a * seq)  # + cross scores
    cross_kv = n * CROSS_KV_PER_ENCODER_TOKEN * inner
    stacks = 2 * n * STACK_PER_TOKEN[kind] * h + 2 * BUCKET_BYTES * seq * seq
    # the chunked loss keeps no log-softmax: only the head's input gradient and the int64 row index
    head = n * HEAD_PER_TOKEN[kind] * spec.vocab if s.full_logits else n * ((2 if kind == "16bit" else 4) * h + 8)
    if s.checkpointing:
        width = 2 if kind == "16bit" else 4
        kept = (spec.layers + spec.decoder_layers) * n * width * h + spec.decoder_layers * n * width * h
        return {"layers": kept + stacks, "head": head, "recompute": max(enc, dec + cross_kv)}
    layers = spec.layers * enc + spec.decoder_layers * (dec + cross_kv)
    return {"layers": layers + stacks, "head": head, "recompute": 0}


def _layer(coef: tuple, h: int, ff: int, inner: int, scores: int) -> int:
    ch, cff, cin, cs = coef
    return ch * h + cff * ff + cin * inner + cs * scores
