"""How fast a training setup runs, relative to another on the same GPU: an estimate the planner compares
choices with (which loss kernel; later, which memory saver). No torch. Units: FLOPs per token, tokens.

The estimate is time per trained token = compute per token / utilisation:

- **Compute** counts the matrix products (docs/design.md's MFU convention, as ``benchmarks/speed_stack.py``
  measures): 2 FLOPs per weight per token forward; backward 4 where the weights train (their gradient and the
  input's) and 2 where they are frozen (LoRA/QLoRA: only the input's gradient flows); attention 4·L·h·s
  forward and twice that backward (12·L·h·s in all); gradient checkpointing runs the decoder layers' forward a
  second time (+2·P_layers + 4·L·h·s). TrainPilot's chunked loss computes the LM head's gradients in its
  forward, chunk by chunk, so it adds no FLOPs to HF's loss.
- **Utilisation** of the GPU grows with the tokens in one micro-batch: n / (n + n½), from a fixed cost per
  micro-batch (kernel launches, Python) beside the FLOPs. Fitted on an H100 with Llama-3.2-1B at sequence 2,048
  without compile (docs/benchmarks.md, docs/design.md): micro-batch 1 with checkpointing ran at 13.1k tokens/s,
  micro-batch 8 without it at 40.9k (3.1×); n½ = 4,096 tokens makes the estimate 3.05×. The fixed cost grows with
  the layers (launches per layer) while the compute grows with the FLOPs per token, so n½ scales as
  layers / FLOPs per token from that fit: a 7B model is half-busy at ~1,300 tokens. A slower GPU spends relatively
  less on the fixed cost (n½ is smaller there; the snapshot does not say how fast the GPU is, so this is not
  counted): the estimate overstates what a larger micro-batch gains on consumer cards. A prior for ranking
  choices, not a prediction of tokens/s.
"""
from __future__ import annotations

from trainer.models.spec import ModelSpec
from trainer.planning.adapters import in_mlp
from trainer.planning.memory import TrainSetup

SMALL_TOKENS = 2048  # below this many tokens per micro-batch a GPU is poorly used
# n½ of the fit above: Llama-3.2-1B (16 layers, 8.22 GFLOPs per token for a full fine-tune at sequence 2,048)
HALF_BUSY_TOKENS, FIT_LAYERS, FIT_FLOPS = 4096, 16, 8.22e9


def flops_per_token(spec: ModelSpec, s: TrainSetup) -> float:
    """Training FLOPs per token (forward, backward and any recompute) of ``s``'s model work."""
    layers = spec.layers * spec.layer_params + spec.decoder_layers * spec.decoder_layer_params
    head = spec.vocab * spec.hidden
    attention = 4.0 * (spec.layers + spec.decoder_layers) * spec.hidden * s.seq_len  # forward
    backward = 4 if s.method == "full" else 2
    total = (2 + backward) * (layers + head) + 3 * attention
    if s.checkpointing:
        total += 2 * layers + attention
    if getattr(s, "tiled_mlp", False):  # the tiles' forward again in backward
        total += 2 * mlp_params(spec)
    return float(total)


def mlp_params(spec: ModelSpec) -> int:
    """Weights of every decoder layer's MLP (the position-wise block a tiled MLP recomputes; ``adapters.in_mlp``)."""
    if spec.groups:
        return sum(g.count * sum(i * o for n, i, o in g.linears if in_mlp(n)) for g in spec.groups)
    return spec.layers * sum(i * o for n, i, o in spec.typical_linears if in_mlp(n))


def tiled_mlp_cost(spec: ModelSpec, s: TrainSetup) -> float:
    """How much more compute tiling the MLP costs ``s`` (0.12 = 12% more FLOPs per token)."""
    on = flops_per_token(spec, TrainSetup(**{**s.__dict__, "tiled_mlp": True}))
    off = flops_per_token(spec, TrainSetup(**{**s.__dict__, "tiled_mlp": False}))
    return on / off - 1


def half_busy_tokens(spec: ModelSpec, s: TrainSetup) -> float:
    """Tokens per micro-batch at which the estimate has the GPU half busy for this model (see above)."""
    full = TrainSetup(**{**s.__dict__, "method": "full", "checkpointing": False})
    layers = spec.layers + spec.decoder_layers
    return HALF_BUSY_TOKENS * (layers / FIT_LAYERS) * (FIT_FLOPS / flops_per_token(spec, full))


def utilisation(tokens: int, half_busy: float = HALF_BUSY_TOKENS) -> float:
    """The share of the GPU a micro-batch of ``tokens`` tokens keeps busy (0-1, see the module docstring)."""
    return tokens / (tokens + half_busy)


def relative_speed(spec: ModelSpec, s: TrainSetup) -> float:
    """Tokens per second of ``s``, up to a constant of the GPU: compare two setups of one model by ratio."""
    tokens = s.micro_batch * s.sequences_per_sample * s.seq_len
    return utilisation(tokens, half_busy_tokens(spec, s)) / flops_per_token(spec, s)


def checkpointing_cost(spec: ModelSpec, s: TrainSetup) -> float:
    """How much more compute checkpointing costs ``s`` (0.27 = 27% more FLOPs per token)."""
    on = flops_per_token(spec, TrainSetup(**{**s.__dict__, "checkpointing": True}))
    off = flops_per_token(spec, TrainSetup(**{**s.__dict__, "checkpointing": False}))
    return on / off - 1
