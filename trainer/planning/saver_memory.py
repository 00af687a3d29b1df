"""What the memory savers and the CUDA runtime really hold on the GPU (bytes). No torch.

Each term is read from the library that allocates it (versions TrainPilot pins or tests: bitsandbytes 0.50.2,
transformers 5.23, TRL 1.16) and checked on the CPU where the CPU can show it (tests/test_qlora_prepare.py,
tests/test_saver_memory.py). Where only a GPU can tell and none has measured it yet, the term is an explicit
margin, named ``*_MARGIN`` here and said in the plan's reasons (``margin_notes``).

- **QLoRA** (``qlora_weight_bytes``): bitsandbytes' ``quantize_4bit`` (NF4, ``bnb_4bit_use_double_quant``) keeps per
  quantised Linear weight of n elements: n/2 bytes of packed 4-bit values, one uint8 absmax per block of 64
  (the double quantisation of the fp32 absmax), one fp32 nested absmax per 256 of those blocks
  (``quantize_blockwise(blocksize=256)``), the weight's own 16-entry fp32 NF4 table (``get_4bit_type`` makes one per
  call), its fp32 offset and its own copy of the 256-entry fp32 dynamic map of the nested absmax
  (``code.to(device, copy=True)``). Everything else — embedding,
  lm_head, norms, biases — stays in the 16-bit compute dtype (``worker.loading.kbit.prepare_kbit_model``).
  While a Linear runs, ``dequantize_4bit`` makes its 16-bit weight and the fp32 absmax (``dequant_buffer``).
- **8-bit AdamW** (``eight_bit_state_bytes``): bitsandbytes' ``Optimizer2State.init_state`` gives a tensor of at
  least ``min_8bit_size`` (4096) elements two uint8 states and two fp32 absmax per block of 256; smaller tensors
  get two fp32 states; transformers' Trainer registers every ``nn.Embedding`` for 32-bit states
  (``GlobalOptimManager.register_module_override(..., {"optim_bits": 32})``: +2.2 GiB for Llama-3.2-3B, docs/design.md).
  The update kernels run in place: no temporaries.
- **Activation offload** (``offload_kept_bytes``): TRL's ``OffloadActivations`` copies every saved tensor of at
  least 1 KiB to pinned host RAM and frees the GPU copy once five later tensors were saved, except a tensor whose
  storage it already holds from a recent save: that one stays on the GPU until backward (``storage_to_tensor_id``),
  so a storage saved twice is never freed there. In HF's layers that is RMSNorm's fp32 copy of its input (saved by
  ``pow`` and by the multiply) and, when the Linears train, the normed input every projection of a block saves.
  (TRL keys a storage by its data pointer plus a view's element offset, so a view with an offset can collide with
  another live tensor and stay too: seen on the CPU with Phi's partial rotary; part of the unmeasured margin.)
- **CUDA runtime** (``runtime_bytes``): what the device shows beyond torch's reserve once the run's kernels are
  loaded: the CUDA context and the kernel modules and library workspaces loaded at first use.
"""
from __future__ import annotations

import math

from trainer.core.units import GIB, MIB

# -- QLoRA: bitsandbytes 0.50.2 quantize_4bit / QuantState ----------------------------------------------------
NF4_BLOCK = 64  # elements per absmax block (quantize_4bit's default blocksize on CUDA and the CPU)
NESTED_BLOCK = 256  # absmax values per nested block (double quantisation: quantize_blockwise(blocksize=256))
NF4_TABLE_BYTES = 16 * 4  # each quantised weight's own fp32 NF4 code table
OFFSET_BYTES = 4  # the fp32 mean subtracted before the nested quantisation
NESTED_MAP_BYTES = 256 * 4  # the fp32 8-bit dynamic map of the nested absmax, copied into every weight's state

# -- 8-bit AdamW: bitsandbytes 0.50.2 Optimizer2State ------------------------------------------------------------
MIN_8BIT_SIZE = 4096  # tensors with fewer elements keep 32-bit states
STATE_BLOCK = 256  # elements per absmax block of the 8-bit states
QMAP_BYTES = 2 * 256 * 4  # the signed and unsigned dynamic maps, shared by every parameter

# -- Activation offload: TRL 1.16 OffloadActivations -------------------------------------------------------------
# Not measured on a GPU: when a brought-back tensor is freed depends on CUDA stream events (TRL keeps the previous
# autograd node's tensors until the next node starts, and record_stream()s views), and the allocator's churn of
# the copies. An explicit margin on the bytes offloaded, until benchmarks/gpu_truth.py measures it.
OFFLOAD_MARGIN = 0.05
# -- Offloaded checkpoints (activation offload with checkpointing: trainer/worker/kernels) -------------------------
# Each checkpointed layer's input goes to pinned host RAM as the forward leaves the layer and comes back before the
# layer is recomputed: the input of the layer in use and the one in flight (copied out in forward, prefetched in
# backward) are on the GPU at once. Not measured on a GPU yet.
CHECKPOINTS_ON_GPU = 2
# Host memory for them comes in pinned blocks of this size (trainer/worker/kernels/offloaded_checkpoint.py
# BLOCK_BYTES): each layer input takes whole blocks.
PINNED_BLOCK_BYTES = 16 * MIB


def offloaded_checkpoint_bytes(layers: int, layer_input: int) -> int:
    """Pinned host RAM for ``layers`` checkpointed inputs of ``layer_input`` bytes each (whole blocks)."""
    return layers * _ceil(layer_input, PINNED_BLOCK_BYTES) * PINNED_BLOCK_BYTES

# -- CUDA runtime beyond torch's reserve --------------------------------------------------------------------------
# Measured on an H100 (CUDA 13, driver 580; docs/design.md): NVML's device-used rise at the first allocation minus
# torch's reserve, 619 MiB. Consumer cards were quoted at ~0.5 GiB (docs/design.md, not measured here): one figure, the
# measured one, for every card.
CUDA_CONTEXT_BYTES = 619 * MIB
# Measured on the H100 through trainpilot-cli run with Liger's Triton kernels loaded (issue 31): the device used
# 13.4 GiB where max_memory_reserved + the bare context was 12.3 GiB: ~1.1 GiB of kernel modules and workspaces.
TRITON_KERNELS_BYTES = int(1.1 * GIB)
# Without Triton kernels: cuBLAS/cuBLASLt and torch's own kernel modules, loaded lazily at first use. Not measured
# apart on a GPU: an explicit margin until benchmarks/gpu_truth.py does.
KERNELS_MARGIN = int(0.25 * GIB)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def nf4_weight_bytes(n: int) -> int:
    """Bytes one NF4 double-quantised weight of ``n`` elements holds on the device with its quantisation state."""
    blocks = _ceil(n, NF4_BLOCK)
    return _ceil(n, 2) + blocks + 4 * _ceil(blocks, NESTED_BLOCK) + NF4_TABLE_BYTES + OFFSET_BYTES + NESTED_MAP_BYTES


def of_spec(spec, key: str, make):
    """``make()``, once per ModelSpec object: a search calls the sums below over every Linear ~100,000 times for one
    unchanging spec (a third of a verdict's time). Kept on the spec itself (its fields are frozen; a spec changed with
    ``dataclasses.replace`` is a new object without the memo); treat what it returns as read-only."""
    memo = spec.__dict__.get("_planner_memo")
    if memo is None:
        memo = {}
        object.__setattr__(spec, "_planner_memo", memo)
    if key not in memo:
        memo[key] = make()
    return memo[key]


def quantized_linears(spec) -> list[int]:
    """Elements of every Linear weight bitsandbytes quantises: each decoder layer's, of every layer kind its
    structure record lists (a hybrid's linear-attention and convolution layers have their own); fused 3-D expert
    parameters are no Linears and lm_head stays 16-bit."""
    return of_spec(spec, "quantized_linears", lambda: _quantized_linears(spec))


def _quantized_linears(spec) -> list[int]:
    if spec.groups:
        stacks = spec.groups + spec.decoder_groups
        return [i * o for g in stacks for _ in range(g.count) for _, i, o in g.linears]
    out = [i * o for i, o in spec.linear_shapes] * spec.layers
    return out + [i * o for i, o in spec.decoder_linear_shapes] * spec.decoder_layers


def fused_experts(spec) -> list[int]:
    """Elements of every fused 3-D expert parameter (MoE layers: all experts of one projection in one tensor)."""
    return of_spec(spec, "fused_experts", lambda: [math.prod(shape) for g in spec.groups + spec.decoder_groups
                                                   for _ in range(g.count) for _, shape in g.experts])


def qlora_weight_bytes(spec, width: int = 2) -> int:
    """Bytes of a prepared QLoRA base: the 4-bit Linears with their quantisation state, and every other
    parameter (embedding, lm_head, norms, biases) in the ``width``-byte compute dtype."""
    nf4, quantized = of_spec(spec, "nf4_bytes", lambda: (sum(map(nf4_weight_bytes, quantized_linears(spec))),
                                                         sum(quantized_linears(spec))))
    return nf4 + width * (spec.params - quantized)


def dequant_buffer_bytes(spec, width: int = 2) -> int:
    """The largest Linear dequantised while it runs (forward, and again for its input's gradient): its 16-bit
    weight and its fp32 block absmax."""
    n = of_spec(spec, "largest_quantized", lambda: max(quantized_linears(spec)))
    return width * n + 4 * _ceil(n, NF4_BLOCK)


def adam8_bytes(n: int) -> int:
    """State bytes of one tensor of ``n`` elements under bitsandbytes' 8-bit AdamW."""
    if n < MIN_8BIT_SIZE:
        return 8 * n
    return 2 * n + 2 * 4 * _ceil(n, STATE_BLOCK)


def eight_bit_state_bytes(spec) -> int:
    """AdamW 8-bit's states for a full fine-tune as HF's Trainer builds it: 8-bit for every large tensor, 32-bit
    for the embeddings (token, and GPT-2's positions; a tied lm_head is the embedding) and for tensors under 4096
    elements (norms and biases: counted at 32-bit, a few MiB high where they are larger); fused MoE experts are
    large tensors too."""
    return of_spec(spec, "eight_bit_state_bytes", lambda: _eight_bit_state_bytes(spec))


def _eight_bit_state_bytes(spec) -> int:
    linears = quantized_linears(spec) + fused_experts(spec)  # MoE: every expert tensor is a large one
    head = spec.vocab * spec.hidden if spec.lm_head_params else 0
    # the frozen towers of a multimodal checkpoint trained on text have no optimizer state
    small = spec.trainable_params - sum(linears) - spec.embedding_params - spec.lm_head_params
    states = sum(adam8_bytes(n) for n in linears) + 8 * spec.embedding_params + 8 * small
    if head:
        states += adam8_bytes(head) + 8 * (spec.lm_head_params - head)  # a head bias (Phi) is small
    return states + QMAP_BYTES


def offload_kept_per_token(spec, s) -> tuple[int, int]:
    """(bytes per token a decoder layer leaves on the GPU under TRL's offload, bytes per token the first layer
    keeps less). Measured with TRL's own context on the CPU (tests/test_saver_memory.py): RMSNorm's fp32 copy of
    its input (saved by ``pow`` and the multiply, 4 bytes per element plus its fp32 rsqrt); when the Linears train,
    the input q/k/v share and the one gate/up share (unless autocast casts a copy per Linear, over fp32 weights),
    and SDPA's output, which o_proj saves again. LayerNorm (Phi, StableLM) saves its input once; GPT-2's fused
    projections take theirs once; Liger's RMSNorm saves its input once. A LoRA model's first norm saves nothing
    (the frozen embedding's output needs no gradient). Checkpointed layers save only their input: nothing twice."""
    h, q, kv, full = spec.hidden, spec.heads * spec.head_dim, spec.kv_width, s.method == "full"
    if s.checkpointing or spec.family == "gpt2":
        return 0, 0
    if spec.family in ("phi", "stablelm"):  # measured in bf16: the normed input shared by the block's projections
        return ((2 if spec.family == "phi" else 4) * h if full else 0), 0
    cast = full and not s.weights_16bit and s.precision != "fp32"  # autocast over fp32 weights: a cast copy per Linear
    norm = 0 if s.liger else 4 * h + 4
    per = {"gemma2": 4}.get(spec.family, 2) * norm
    if spec.family == "qwen3" and not s.liger:  # q_norm and k_norm over the heads
        per += 4 * (q + kv) + 4 * (spec.heads + spec.kv_heads)
    if full and not cast:
        per += 2 * s.activation_width * h
    if full and s.attn != "eager":
        per += s.activation_width * q
    return per, (0 if full else norm)


def offload_kept_bytes(spec, s) -> int:
    """Bytes of saved activations TRL's offload leaves on the GPU for the whole micro-batch (every layer)."""
    if not s.activation_offload or s.device != "cuda" or spec.encoder_decoder:
        return 0
    per, first_less = offload_kept_per_token(spec, s)
    return s.micro_batch * s.sequences_per_sample * s.seq_len * (spec.layers * per - first_less)


def runtime_bytes(s) -> dict:
    """What the device holds beyond torch's reserve: ``cuda_context`` (measured) and ``cuda_kernels`` (measured
    with Triton kernels; an explicit margin without)."""
    if s.device != "cuda":
        return {}
    return {"cuda_context": CUDA_CONTEXT_BYTES,
            "cuda_kernels": TRITON_KERNELS_BYTES if s.triton_kernels else KERNELS_MARGIN}


def margin_notes(breakdown: dict, s=None, fragmentation_share: float = 0.0) -> list[str]:
    """The plan's words for each unmeasured margin it carries (empty when it carries none); ``s`` (the plan's
    TrainSetup) and its ``fragmentation_share`` (``memory.fragmentation_share``) name the fragmentation margin and
    the offloaded checkpoints."""
    out = []
    zero3 = s is not None and s.deepspeed and s.zero_stage == 3
    if s is not None and breakdown.get("fragmentation") and s.expandable_segments and not zero3:
        out.append(f"fragmentation: {fragmentation_share:.0%} of the tensors that churn, the share measured "
                   "without the allocator's expandable segments, which the worker turns on; kept as an upper bound "
                   "until they are measured on a GPU")
    if s is not None and s.activation_offload and s.checkpointing and s.device == "cuda":
        out.append(f"offloaded checkpoints: {CHECKPOINTS_ON_GPU} checkpointed layer inputs on the GPU at once (the "
                   "one in use and the one being copied), not measured on a GPU yet")
    if breakdown.get("offload_margin"):
        out.append(f"activation offload: a {OFFLOAD_MARGIN:.0%} margin on the offloaded activations stays on the GPU "
                   "in this plan (TRL's stream-ordered frees are not measured on a GPU yet)")
    if breakdown.get("cuda_kernels") == KERNELS_MARGIN:
        out.append(f"CUDA kernels: {KERNELS_MARGIN / GIB:.2f} GiB for kernel modules and library workspaces loaded "
                   "at first use is a margin, not measured on a GPU yet (with Triton kernels it was: 1.1 GiB)")
    return out


# -- What a simulated step (trainer/worker/probes/simulate.py) cannot hold ------------------------------------------
# The one list, read by the simulation, plan --simulate (trainer/cli/simulated.py) and benchmarks/simulated_truth.py:
# a simulation on fake tensors counts the bytes of live tensors op by op, so whatever the device holds outside
# torch's tensors, or between them, is compared apart (the plan's margins). Each reason says whether the margin was
# measured on a GPU, and where.
NOT_SIMULATED = {
    "cuda_context": "a margin for the CUDA context (no tensor holds it): measured on the H100, NVML's rise at the "
                    f"first allocation minus torch's reserve, {CUDA_CONTEXT_BYTES // MIB} MiB (docs/design.md); "
                    "one figure for every card, consumer cards not measured",
    "cuda_kernels": "a margin for kernel modules and library workspaces (cuBLAS/cuBLASLt, torch's own modules, "
                    "Triton's compiled kernels) loaded at first use, outside torch's tensors: with Triton kernels "
                    f"measured on the H100 ({TRITON_KERNELS_BYTES / GIB:.1f} GiB through trainpilot-cli run, "
                    "issue 31; the H200 rows of docs/planner.md ran with them); without them a "
                    f"{KERNELS_MARGIN / GIB:.2f} GiB margin not measured on a GPU",
    "fragmentation": "a margin for the caching allocator's rounding (512-byte blocks, 2 MiB segments) and the slack "
                     "between freed blocks; a simulation counts exact tensor bytes: the shares were measured on the "
                     "H100 without expandable segments (docs/benchmarks.md), not yet with them (the worker's)",
    "offload_margin": f"a {OFFLOAD_MARGIN:.0%} margin on the bytes TRL's activation offload copies out, for its "
                      "CUDA-stream-ordered frees (a simulation has no streams; TRL's offload without checkpointing "
                      "is not simulated at all): not measured on a GPU",
    "paged_states_working_set": "a margin for the paged states of the parameter being updated (the largest "
                                "parameter's), which bitsandbytes' prefetch_state brings to the GPU as CUDA managed "
                                "memory: the driver maps those pages beside the caching allocator's reserve, which "
                                "keeps the step's high-water mark (no empty_cache in the worker), so they add to the "
                                "step's peak at whatever moment the parameter is updated; a simulation of live "
                                "tensors would place them in blocks the allocator holds (it reports their size, "
                                "paged_working_set_bytes); read in bitsandbytes 0.50.2, not measured on a GPU",
    "managed_memory": "no component of the plan: the pages of bitsandbytes' paged states (CUDA managed memory) the "
                      "driver keeps resident on the GPU beyond the working set of the parameter being updated "
                      "(paged_states_working_set, the margin above); neither planned nor simulated, not measured "
                      "on a GPU",
}
# Host RAM a simulation does not hold: paged optimizer states and offloaded checkpoints are simulated in host RAM
# (fake ``cpu``); TRL's offloaded activations are not (their rows are not simulated).
HOST_NOT_SIMULATED = {
    "runtime": "the interpreter's own RAM (python, torch, transformers): 0.43 GB measured on a CPU, planned at 0.5 GiB",
    "loading": "the checkpoint's 16-bit weights passing through host RAM while the model loads (a simulation "
               "builds the model on meta: nothing is loaded); planned as the checkpoint's size, not measured",
}
