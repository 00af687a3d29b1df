"""A full fine-tune's gradients and AdamW states without DeepSpeed (bytes): where the states live and whether the
optimizer step runs after backward (a full gradient buffer) or inside it (``training.optimizer_in_backward``,
trainer/worker/loading/in_backward_step.py). No torch.

- **The separate step** keeps every parameter's gradient until the step: ``weight_width`` bytes per parameter.
- **The fused step** updates each parameter from its post-accumulate-grad hook and frees the gradient at once, so
  only the gradient being applied is alive: the largest parameter's (the embedding or the LM head). Its hook first
  measures the gradient's norm in fp32, ``NORM_CHUNK`` elements at a time (``vector_norm(chunk, dtype=float32)``
  makes an fp32 copy of what it measures, 4 bytes per element: measured with PyTorch's memory profiler on the CPU;
  whole, that copy was 2.0 GiB for Llama-3.1-8B's embedding), then steps: PyTorch's foreach AdamW takes one
  temporary of the state's size (``sqrt(exp_avg_sq)``), bitsandbytes' kernels none. Where the chunked loss (or Liger's) computes the LM head's gradient in the loss's forward
  and holds it until backward (``memory._chunked_logits_bytes`` counts it), that held gradient is the one the head's
  hook applies: not counted twice.
- **States** (``TrainSetup.optimizer``, a row of ``config.placements``): PyTorch's AdamW keeps two in the parameters' dtype; bitsandbytes'
  32-bit AdamW two fp32 ones whatever the parameters' dtype; its 8-bit AdamW 8-bit ones, with HF's override keeping
  the embeddings' in 32 bits (``saver_memory.eight_bit_state_bytes``) under the separate step. Under the fused step
  the embeddings' states are 8-bit too, as in torchtune's recipe (the fused step drops HF's override: bitsandbytes'
  manager keys an override by the parameter's place in its optimizer, (0, 0) for every per-parameter optimizer, so
  the embedding's would reach every optimizer initialised after it; in_backward_step.py).
- **Paged states** (``paged_*``: CUDA managed memory) are planned in host RAM, where the driver pages them under
  memory pressure, with a working set on the GPU: the largest parameter's states, which bitsandbytes prefetches
  whole (``prefetch_state``) before that parameter's update kernel reads them. Smaller working sets run but fault
  page by page (thrashing); larger ones are not needed, since one parameter is updated at a time. On Windows managed
  memory cannot oversubscribe the GPU (CUDA C++ Programming Guide, unified memory on Windows and WSL: no
  oversubscription, no on-demand page migration), so there paged states are planned on the GPU
  (``TrainSetup.paged_on_gpu``).
"""
from __future__ import annotations

from trainer.config.placements import placement
from trainer.models.spec import ModelSpec
from trainer.planning import saver_memory
from trainer.planning.setup import TrainSetup

NORM_COPY_WIDTH = 4  # the fused step's fp32 copy of the gradient it measures (bytes per element)
NORM_CHUNK = 1 << 24  # elements the fused step measures at a time (its fp32 copy: 64 MiB at most); the worker reads it


def state_words(s: TrainSetup) -> str:
    """The states of ``s.optimizer`` in words (``config.placements``): PyTorch AdamW's in the weights' dtype."""
    p = placement(s.optimizer)
    if p.state_width is None:
        return f"{p.states} ({'16-bit' if s.weight_width == 2 else 'fp32'})"
    return p.states


def largest_param(spec: ModelSpec) -> int:
    """Elements of the largest single trained parameter: the embedding or the LM head, or a larger Linear or fused
    expert tensor."""
    return saver_memory.of_spec(spec, "largest_param", lambda: max(
        [spec.largest_layer_params, *saver_memory.quantized_linears(spec), *saver_memory.fused_experts(spec)]))


def state_bytes(spec: ModelSpec, s: TrainSetup) -> int:
    """Every trained parameter's AdamW states under ``s.optimizer`` (bytes)."""
    p = placement(s.optimizer)
    if p.eight_bit:
        return _fused_eight_bit_bytes(spec) if s.in_backward else saver_memory.eight_bit_state_bytes(spec)
    return 2 * (p.state_width or s.weight_width) * spec.trainable_params


def largest_state_bytes(spec: ModelSpec, s: TrainSetup) -> int:
    """The states of the parameter with the most (bytes): the paged states' working set on the GPU. Under 8-bit
    AdamW with the separate step the embeddings keep 32-bit states (HF's override), so theirs usually are the
    largest; under the fused step they are 8-bit like the rest."""
    n, p = largest_param(spec), placement(s.optimizer)
    if p.eight_bit:
        eight = saver_memory.adam8_bytes(n)
        return eight if s.in_backward else max(8 * spec.embedding_params, eight)
    return 2 * (p.state_width or s.weight_width) * n


def gradient_bytes(spec: ModelSpec, s: TrainSetup) -> dict:
    """The gradients on the GPU: the whole buffer for the separate step; for the fused step the largest parameter's
    gradient (unless the loss already holds it) and the hook's fp32 norm copy (``in_backward_workspace``)."""
    if not s.in_backward:
        return {"gradients": s.weight_width * spec.trainable_params}
    n = largest_param(spec)
    held_by_loss = s.objective == "sft" and not s.full_logits and spec.vocab * spec.hidden >= n
    return {"gradients": 0 if held_by_loss else s.weight_width * n,
            "in_backward_workspace": NORM_COPY_WIDTH * min(n, NORM_CHUNK)}


def tied_gradient_bytes(spec: ModelSpec, s: TrainSetup) -> int:
    """The gradients a full fine-tune of a model with tied embeddings (the LM head is the embedding) holds beyond
    the one weight gradient ``gradient_bytes`` (or the chunked loss's ``logits_loss``) plans: the LM head and the
    embedding are one leaf reached by two edges, so the autograd engine keeps the head's weight gradient in the
    leaf's input buffer through the whole backward, and at its end (the embedding's backward, its last op) adds
    the embedding's to it out of place: three weight gradients alive at once for that moment, two beyond the one
    planned. Counted under the worker's ``InBackwardStep`` on the CPU, bytes exact (tests/test_in_backward_gradients.py);
    the engine's buffering is the same on CUDA (not measured on a GPU). ``memory.estimate`` plans what of it is
    not already covered by the transients freed by then (``tied_gradients``)."""
    if not spec.tied_embeddings or s.method != "full" or spec.encoder_decoder:
        return 0
    return 2 * s.weight_width * spec.vocab * spec.hidden


def _fused_eight_bit_bytes(spec: ModelSpec) -> int:
    """8-bit AdamW's states under the fused step: HF's 32-bit embedding override dropped, the embeddings' states are
    8-bit like every large tensor (``saver_memory.eight_bit_state_bytes`` with the embeddings moved across)."""
    return saver_memory.eight_bit_state_bytes(spec) - 8 * spec.embedding_params + \
        saver_memory.adam8_bytes(spec.embedding_params)


def full_states(spec: ModelSpec, s: TrainSetup) -> tuple[dict, dict]:
    """(device bytes, host bytes) of a full fine-tune's weights, gradients and optimizer states without DeepSpeed."""
    device = {"weights": s.weight_width * spec.trainable_params, **gradient_bytes(spec, s)}
    states = state_bytes(spec, s)
    if s.paged_to_host:
        return {**device, "paged_states_working_set": largest_state_bytes(spec, s)}, {"paged_optimizer_states": states}
    return {**device, "optimizer_states": states}, {}


def paging_bytes_per_step(est_host: dict) -> int:
    """Bytes the paged states cross PCIe per optimizer step when they live in host RAM: each parameter's states
    come in for its update and go back out (the planner's upper bound: every page, both ways)."""
    return 2 * est_host.get("paged_optimizer_states", 0)
