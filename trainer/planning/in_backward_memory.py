"""The fused step's memory (``training.optimizer_in_backward``, the optimizer step fused into backward): its moments,
each the transient components alive then, and the gradients in flight through a layer's backward. ``memory.estimate``
keeps the largest moment (issue 46: the simulated step peaks there; docs/planner.md). Bytes. No torch.
"""
from __future__ import annotations

from trainer.models.spec import ModelSpec
from trainer.planning import optimizer_memory
from trainer.planning.setup import TrainSetup


def layer_backward_bytes(spec: ModelSpec, s: TrainSetup) -> int:
    """The gradients in flight through one decoder layer's backward beside its saved (or recomputed) tensors, at the
    layer's largest moment (bytes; the fused step plans it as its own moment, ``fused_step_moments``). Counted op by
    op in the simulated step (trainer/worker/probes/simulate.py, the worker's own layers and tiling) for Llama and
    Qwen3 layers: an untiled gated MLP's backward holds the layer output's gradient (b·s·h) and three I-wide
    gradients (of the product, the gate's and the up projection's outputs) where down_proj's saved input (the
    product, counted in the recompute) is already freed: b·s·(h + 2I) elements; a tiled one (``speed.tiled_mlp``)
    holds the layer output's gradient and the tiled block's input gradient (2·b·s·h; the tile itself is
    ``mlp_tile``) and the MLP's weight gradients twice (summed over the tiles, and the tile's own: the tiled
    backward hands them to autograd once, at its end) with one more weight's being formed: 7·h·I."""
    tokens = s.micro_batch * s.sequences_per_sample * s.seq_len
    h, inter, width = spec.hidden, spec.intermediate, s.activation_width
    if s.mlp_tiled(spec):
        return 2 * width * tokens * h + 7 * s.weight_width * h * inter
    return width * tokens * (h + 2 * inter)


def fused_step_moments(spec: ModelSpec, s: TrainSetup, acts: dict, b: dict) -> dict:
    """The fused step's moments (``training.optimizer_in_backward``), each the transient components live then
    (bytes; the weights, states and the paged states' working set are held beside every one). As the worker runs it
    (trainer/worker/loading/in_backward_step.py: each parameter is stepped by its post-accumulate-grad hook, which
    autograd runs as soon as the gradient is complete, and the gradient is freed there):

    - ``loss``: the end of forward and the loss, with every layer's saved tensors (or checkpoints) and the head's:
      the loss's working memory, with the LM head's gradient the chunked loss computes in its forward and holds;
    - ``layer``: the backward of the last layer (every checkpoint still held): its recompute, the MLP tile and the
      gradients in flight (``layer_backward_bytes``); the head's saved tensors and the loss are freed by then, and
      an untied LM head was stepped (its gradient freed) as the loss's backward handed it on; a tied one's gradient
      is buffered by the engine until the embedding's backward adds to it;
    - ``end``: the embedding's backward, the activations freed: its gradient (the largest parameter's), the tied
      embeddings' two more (``optimizer_memory.tied_gradient_bytes``).

    The fused-step workspace (one chunk of the norm's fp32 copy) is in each (a hook may run at any of them)."""
    head = acts.get("head", 0)
    held = {k: b.get(k, 0) for k in ("attention_mask", "vision_activations", "offload_kept", "offload_margin")}
    held["in_backward_workspace"] = b.get("in_backward_workspace", 0)
    tied = optimizer_memory.tied_gradient_bytes(spec, s)
    buffered = s.weight_width * spec.vocab * spec.hidden if tied else 0  # the head's gradient, until the embedding's
    loss = {**held, "activations": b.get("activations", 0), "logits_loss": b.get("logits_loss", 0),
            "gradients": b.get("gradients", 0), "vision_forward": b.get("vision_forward", 0),
            "reference_forward": b.get("reference_forward", 0)}
    layer = {**held, "activations": max(0, b.get("activations", 0) - head), "recompute": b.get("recompute", 0),
             "mlp_tile": b.get("mlp_tile", 0), "layer_backward": layer_backward_bytes(spec, s),
             "gradients": buffered}
    end = {**held, "gradients": s.weight_width * optimizer_memory.largest_param(spec), "tied_gradients": tied}
    return {"loss": loss, "layer": layer, "end": end}


def at_largest_moment(b: dict, moments: dict, transients: frozenset) -> tuple[dict, dict]:
    """(the breakdown with the transients (``transients``: the components a moment holds) of the largest moment only,
    each moment's transient bytes)."""
    sums = {name: sum(parts.values()) for name, parts in moments.items()}
    top = max(sums, key=sums.get)
    held = {k: v for k, v in b.items() if k not in transients}
    return {**held, **moments[top]}, sums
