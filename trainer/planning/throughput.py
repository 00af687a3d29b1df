"""How busy a micro-batch keeps the GPU, and what two savers cost in compute: the utilisation fit the plan's one time
model (``speed.optimizer_step``) computes with, and the shares the plan's savings rows quote. No torch. Units:
FLOPs per token, tokens.

- **Compute** is ``flops.flops_per_token`` (the plan's one count: LoRA's backward, checkpointing's recompute, the
  tiled MLP, attention). TrainPilot's chunked loss computes the LM head's gradients in its forward, chunk by
  chunk, so it adds no FLOPs to HF's loss.
- **Utilisation** of the GPU grows with the tokens in one micro-batch: n / (n + n½), from a fixed cost per
  micro-batch (kernel launches, Python) beside the FLOPs. Fitted on an H100 with Llama-3.2-1B at sequence 2,048
  without compile (docs/benchmarks.md, docs/design.md): micro-batch 1 with checkpointing ran at 13.1k tokens/s,
  micro-batch 8 without it at 40.9k (3.1×); n½ = 4,096 tokens makes the estimate 3.05×. The fixed cost grows with
  the layers (launches per layer) while the compute grows with the FLOPs per token, so n½ scales as
  layers / FLOPs per token from that fit: a 7B model is half-busy at ~1,300 tokens on the H100. The fixed cost is
  time, so on a slower card the same tokens are a larger share of the step and n½ is smaller in proportion to the
  card's peak (``speed.half_busy``). A prior for ranking choices, not a prediction of tokens/s.
"""
from __future__ import annotations

from dataclasses import replace

from trainer.models.spec import ModelSpec
from trainer.planning.flops import flops_per_token
from trainer.planning.setup import TrainSetup

# n½ of the fit above: Llama-3.2-1B (16 layers, 8.22 GFLOPs per token for a full fine-tune at sequence 2,048)
HALF_BUSY_TOKENS, FIT_LAYERS, FIT_FLOPS = 4096, 16, 8.22e9


def tiled_mlp_cost(spec: ModelSpec, s: TrainSetup) -> float:
    """How much more compute tiling the MLP costs ``s`` (0.12 = 12% more FLOPs per token)."""
    on = flops_per_token(spec, replace(s, tiled_mlp=True))
    off = flops_per_token(spec, replace(s, tiled_mlp=False))
    return on / off - 1


def half_busy_tokens(spec: ModelSpec, s: TrainSetup) -> float:
    """Tokens per micro-batch at which the estimate has the H100 half busy for this model (see above)."""
    full = replace(s, method="full", checkpointing=False)
    layers = spec.layers + spec.decoder_layers
    return HALF_BUSY_TOKENS * (layers / FIT_LAYERS) * (FIT_FLOPS / flops_per_token(spec, full))


def utilisation(tokens: int, half_busy: float = HALF_BUSY_TOKENS) -> float:
    """The share of the GPU a micro-batch of ``tokens`` tokens keeps busy (0-1, see the module docstring)."""
    return tokens / (tokens + half_busy)


def checkpointing_cost(spec: ModelSpec, s: TrainSetup) -> float:
    """How much more compute checkpointing costs ``s`` (0.27 = 27% more FLOPs per token)."""
    on = flops_per_token(spec, replace(s, checkpointing=True))
    off = flops_per_token(spec, replace(s, checkpointing=False))
    return on / off - 1
