"""The compute of a training step: matrix FLOPs per trained token, the one count the plan's one time model uses
(``speed.optimizer_step``: every decision a plan makes by time; ``throughput``: the tiled MLP's and checkpointing's
cost in the savings rows), and the MFU of the benchmarks. No torch.

Per token, with W the weights of the decoder layers a token goes through (every layer kind, T5's decoder too),
H = vocab × hidden the LM head's (a tied embedding still does the head's matmul; the embedding lookup is free),
and A = 4 · s · (heads × head_dim) per attention layer (the scores Q·Kᵀ and the weighted sum, 2·s·heads·head_dim
FLOPs each at sequence length s; the causal half is counted, as the MFU convention does):

- **forward**: 2 per weight (one multiply-add) — 2·(W + H) + A.
- **backward**: the input's gradient is another 2 per weight, and where the weights train their gradient is 2 more:
  4·(W + H) for a full fine-tune, 2·(W + H) for LoRA/QLoRA (the frozen base passes the input's gradient only; the
  adapters' own FLOPs are < 1% and not counted). Attention has no weights but two gradients per product (of both
  operands: Q and K, the scores and V), 2·A, with adapters too: the gradient flows through it to every layer below.
- **checkpointing** recomputes every decoder layer's forward in backward: + 2·W + A (the head is not inside a
  checkpointed layer).
- **the tiled MLP** (``speed.tiled_mlp``) runs each tile's MLP forward again in its backward: + 2 per MLP weight
  (under checkpointing as well: the recomputed forward is the no-grad tiled one). Counted wherever it is asked for:
  the worker tiles every model it does not refuse before the run, also where the memory formulas plan the layers
  untiled (``TrainSetup.mlp_tiled``: the 16-bit layouts they were measured on).

A full fine-tune without checkpointing is 6·(W + H) + 12·L·s·heads·head_dim: the MFU convention (Kaplan's 6N plus
attention; PaLM's appendix B), 8.22 GFLOPs per token for Llama-3.2-1B at sequence 2,048. This replaces two counts
that disagreed (issue 40): ``speed`` took a LoRA step as two forwards (attention's backward undercounted by a
third), ignored the tiled MLP and counted a multimodal checkpoint's vision tower in every text token; ``throughput``
took attention's width as the hidden size (Gemma's and Qwen3's heads × head_dim differ) and counted every layer as
the most common kind and as attention (hybrid models' linear-attention and convolution layers have no s² term). Not
counted: a MoE's inactive experts (counted as dense), a sliding window's shorter span, the vision tower's FLOPs for
pictures.
"""
from __future__ import annotations

from trainer.models.spec import ModelSpec
from trainer.planning.adapters import in_mlp
from trainer.planning.setup import TrainSetup


def flops_per_token(spec: ModelSpec, s: TrainSetup) -> float:
    """Matrix FLOPs per trained token of setup ``s`` (its ``method``, ``seq_len``, ``checkpointing`` and tiled MLP):
    forward, backward and any recompute (see the module docstring)."""
    layers = layer_weights(spec)
    head = spec.vocab * spec.hidden
    attention = 4.0 * s.seq_len * spec.heads * spec.head_dim * (spec.attention_layers + spec.decoder_layers)
    backward = 4 if s.method == "full" else 2
    total = (2 + backward) * (layers + head) + 3 * attention
    if s.checkpointing:
        total += 2 * layers + attention
    if s.tiled_mlp:
        total += 2 * mlp_params(spec)
    return float(total)


def layer_weights(spec: ModelSpec) -> int:
    """Weights of every decoder layer a token goes through (each layer kind × its count; T5's decoder as well)."""
    layers = sum(g.count * g.params for g in spec.groups) if spec.groups else spec.layers * spec.layer_params
    return layers + spec.decoder_layers * spec.decoder_layer_params


def mlp_params(spec: ModelSpec) -> int:
    """Weights of every decoder layer's MLP (the position-wise block a tiled MLP recomputes; ``adapters.in_mlp``)."""
    if spec.groups:
        return sum(g.count * sum(i * o for n, i, o in g.linears if in_mlp(n)) for g in spec.groups)
    return spec.layers * sum(i * o for n, i, o in spec.typical_linears if in_mlp(n))
