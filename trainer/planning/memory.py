"""Peak GPU memory and host RAM of a training setup, per component (bytes). No torch.

Formulas (docs/design.md "Memory, per component"), checked against measurement in tests/test_memory.py:
model states follow DeepSpeed's own estimators exactly; activations are what autograd saves in HF
Llama-family layers (saved-tensor hooks) — hand-fitted for the families in ``spec.FITTED_FAMILIES``, measured by
the structure probe for every other architecture (``planning/measured.py``); logits/loss, CUDA context,
fragmentation and DeepSpeed buckets are what those estimators ignore. A multimodal checkpoint trained on text
keeps its towers frozen (16-bit weights, no gradients, no optimizer states, no activations).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from trainer.config.placements import placement
from trainer.core.units import GIB
from trainer.models.spec import ModelSpec
from trainer.planning import adapters, grpo_memory, in_backward_memory, layer_split, measured, optimizer_memory
from trainer.planning import packed_mask, saver_memory
from trainer.planning import picture_memory as pictures
from trainer.planning.tiled_memory import mlp_tile_bytes, tiled_input_bytes, tiled_layer_per_token
from trainer.planning.saver_memory import CUDA_CONTEXT_BYTES  # noqa: F401  (re-exported: plan --measure, tests)
from trainer.planning.seq2seq_memory import seq2seq_activation_bytes
from trainer.planning.setup import TrainSetup  # its home; imported from here too

# Caching-allocator slack (reserved minus allocated at the peak) as a share of the tensors that churn
# every step. Measured on an H100 (docs/benchmarks.md): 5-12% of churn without checkpointing, 11-34%
# with it (recomputation frees and reallocates every layer). Under ZeRO-3 (each layer's parameters
# gathered and released around its forward and backward) it was 55-59% while the allocated terms
# below run 13-15% high there: 35% nets the two (fitted on the same runs; see docs/benchmarks.md).
FRAGMENTATION = 0.10
FRAGMENTATION_CHECKPOINTING = 0.25
FRAGMENTATION_ZERO3 = 0.35
# CUDA workers run with PyTorch's expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True): a segment
# grows by mapping pages instead of adding blocks beside the old, and at the cap the allocator unmaps the free pages
# of cached blocks before it gives up, which should strand less than the figures above, measured without them. Not
# measured with them on a GPU yet: those figures stay, as an upper bound (said in the plan:
# ``saver_memory.margin_notes``), until benchmarks/gpu_truth.py measures the expandable allocator.
DS_BUFFER_FACTOR = 1.5  # DeepSpeed's additional_buffer_factor for host memory
RUNTIME_HOST_BYTES = int(0.5 * GIB)  # python + torch + transformers RSS (0.43 GB measured on CPU)
LORA_TRAINABLE_BYTES = 16  # fp32 adapter weight + grad + two AdamW states
FUSED_HEAD_PER_TOKEN = 16  # TRL's fused LM head saves log Z and entropy (fp32) and the int64 target per token
FUSED_TOKEN_TILE, FUSED_VOCAB_CHUNK = 4096, 32768  # trl.kernels.chunked_logprob tiles (tokens × vocabulary)
# The chunked loss (trainer/worker/kernels/chunked_loss.py; which loss a run uses: planning/loss_kernel.py): the
# fp32 logits of one chunk of tokens are at most this many bytes (520 tokens of Llama 3's 128,256-token vocabulary:
# large enough that the LM head's gradient, accumulated once per chunk, costs little time on a GPU).
CHUNK_LOGIT_BYTES = 256 * 2**20
# The chunked loss per logit of one chunk: the 16-bit logits, their fp32 copy (worked on in place) and the 16-bit
# gradient (8), plus tanh's fp32 output kept for its derivative under Gemma's soft-capping (4)
CHUNK_BYTES_PER_LOGIT, SOFTCAP_BYTES_PER_LOGIT = 8, 4
SOFTCAPPED_FAMILIES = frozenset({"gemma2"})  # final_logit_softcapping set in their configs (Gemma 3's is None)
LAYERNORM_HEAD_FAMILIES = frozenset({"stablelm", "phi"})  # a LayerNorm, not an RMSNorm, before the LM head


def loss_chunk_tokens(vocab: int) -> int:
    """Tokens per chunk of the chunked loss: fp32 logits of at most ``CHUNK_LOGIT_BYTES``, a multiple of 8
    (tensor-core friendly), at least 8. 440 for Qwen's 151,936-token vocabulary, 520 for Llama 3's."""
    return max(8, CHUNK_LOGIT_BYTES // (4 * vocab) // 8 * 8)


def liger_chunk_tokens(tokens: int, vocab: int, hidden: int) -> int:
    """Rows per chunk of Liger's fused linear cross-entropy (liger_kernel/ops/fused_linear_cross_entropy.py):
    the next power of two of tokens / ceil(vocab / hidden), so a chunk's logits are about as large as the
    hidden states."""
    rows = -(-tokens // -(-vocab // hidden))
    return 1 << max(0, rows - 1).bit_length()


@dataclass(frozen=True)
class Estimate:
    """Predicted memory: ``breakdown`` (device bytes per component) sums to ``peak_bytes``;
    ``host_breakdown`` sums to ``host_ram_bytes``. GRPO runs in two phases: ``phases`` gives each one's
    device bytes (``{"sampling": ..., "update": ...}``) and ``phase_breakdown`` each one's components;
    ``breakdown`` is the larger phase's. Other objectives leave both empty. The fused step
    (``training.optimizer_in_backward``) peaks at the largest of its moments
    (``in_backward_memory.fused_step_moments``): ``moments`` gives each one's transient bytes (beside the weights and
    states) and ``breakdown`` holds the largest one's."""

    breakdown: dict
    peak_bytes: int
    host_breakdown: dict
    host_ram_bytes: int
    trainable_params: int
    notes: tuple[str, ...] = field(default=())
    phases: dict = field(default_factory=dict)
    phase_breakdown: dict = field(default_factory=dict)
    moments: dict = field(default_factory=dict)
    # the layers split over several cards (planning/layer_split): each card's share (``Card.to_dict``), in order;
    # ``breakdown`` and ``peak_bytes`` are then the binding card's (the least room)
    cards: tuple = ()
    unsplit: dict = field(default_factory=dict)  # with ``cards``: the one-card breakdown the split apportions


def lora_params(spec: ModelSpec, setup: TrainSetup) -> int:
    """Adapter parameters of a LoRA/QLoRA run (``adapters.lora_params``: PEFT's targets, every layer kind), with the
    vision tower's when ``method.train_vision`` is all (``pictures.trainable``)."""
    return adapters.lora_params(spec, setup) + pictures.trainable(spec, setup)[1]


def model_states(spec: ModelSpec, s: TrainSetup) -> tuple[dict, dict]:
    """(device bytes, host bytes) of weights, gradients and optimizer states.

    With DeepSpeed these equal ``estimate_zero2/3_model_states_mem_needs`` (zero_init=True);
    without it, torch AdamW keeps its two states in the parameters' dtype. ``spec`` as ``estimate`` passes it: a
    full fine-tune's trained vision parameters already unfrozen (``pictures.with_trained_vision``)."""
    if s.method in ("lora", "qlora"):  # (a multimodal checkpoint trained on text: its towers stay frozen)
        return _adapter_states(spec, s)
    if s.deepspeed and s.device == "cuda":
        return _with_frozen(spec, s, *_zero_states(spec, s))
    return _with_frozen(spec, s, *optimizer_memory.full_states(spec, s))


def _with_frozen(spec: ModelSpec, s: TrainSetup, device: dict, host: dict) -> tuple[dict, dict]:
    """Add the frozen towers of a multimodal checkpoint: 16-bit weights with no gradient or optimizer state (on
    the host when ZeRO-3 offloads parameters)."""
    if not spec.frozen_params:
        return device, host
    frozen = {"frozen_weights": 2 * spec.frozen_params}
    if s.deepspeed and s.device == "cuda" and s.zero_stage == 3 and s.offload_params:
        return device, {**host, **frozen}
    return {**device, **frozen}, host


def reference_bytes(spec: ModelSpec, s: TrainSetup) -> tuple[int, int]:
    """(device bytes, host bytes) of DPO's/KTO's (GRPO's with beta > 0) reference model. None with LoRA/QLoRA (TRL scores the
    reference with the adapters disabled) or with precomputed reference log-probabilities; a frozen copy
    of the weights for a full fine-tune (16-bit under DeepSpeed; sharded by ZeRO-3, on the host with
    parameter offload)."""
    if s.method != "full" or not _has_reference(s):
        return 0, 0
    wb = 2 if s.deepspeed and s.device == "cuda" else s.weight_width
    if s.deepspeed and s.device == "cuda" and s.zero_stage == 3:
        return (0, wb * spec.params) if s.offload_params else (wb * spec.params // s.world, 0)
    return wb * spec.params, 0


def _has_reference(s: TrainSetup) -> bool:
    """DPO/KTO score a reference unless it was precomputed; GRPO only with a KL term (beta > 0)."""
    if s.objective == "grpo":
        return s.beta > 0
    return s.objective in ("dpo", "kto") and not s.precompute_ref


def objective_transient_bytes(spec: ModelSpec, s: TrainSetup) -> int:
    """Working memory of the forwards run without gradients inside a step (bytes): DPO's/KTO's reference
    forward and KTO's KL forward hold one layer's intermediates (hidden, q/k/v, the MLP's three
    I-wide tensors) for their whole batch at a time, while the policy's activations are kept."""
    if s.objective not in ("dpo", "kto") or (s.precompute_ref and s.objective == "dpo"):
        return 0
    tokens = s.micro_batch * s.sequences_per_sample * s.seq_len
    per_layer = s.weight_width * (3 * spec.hidden + 2 * spec.kv_width + 3 * spec.intermediate)
    return tokens * per_layer * (2 if s.objective == "kto" else 1)


def _zero_states(spec: ModelSpec, s: TrainSetup) -> tuple[dict, dict]:
    P, N, g = spec.trainable_params, s.world, s.gpus_per_node
    f = DS_BUFFER_FACTOR
    if s.zero_stage == 3:
        gather = 4 * spec.largest_layer_params
        if s.offload_params:
            return {"zero3_gather": gather}, {"offloaded_states": int(P * 18 / s.num_nodes * f)}
        if s.offload_optimizer:
            return {"zero3_gather": gather, "weights": int(2 * P / N)}, {"offloaded_states": int(P * 16 / s.num_nodes * f)}
        return ({"zero3_gather": gather, "weights": int(2 * P / N), "gradients": int(6 * P / N),
                 "optimizer_states": int(18 * P / N) - int(2 * P / N) - int(6 * P / N)},
                {"zero3_init_buffer": int(spec.largest_layer_params * 4 * g * f)})
    if s.offload_optimizer:
        return {"weights": 2 * P}, {"offloaded_states": int(P * max(4 * N, 16) * f)}
    # stage 0/1 keep full 16-bit gradients on every GPU; stage 2 partitions them (DeepSpeed's 18P/N)
    grads = 2 * P + int(4 * P / N) if s.zero_stage < 2 else int(6 * P / N)
    opt = int(12 * P / N) if s.zero_stage >= 1 else 12 * P
    return {"weights": 2 * P, "gradients": grads, "optimizer_states": opt}, {"fp32_copy": int(P * 4 * g * f)}


def _adapter_states(spec: ModelSpec, s: TrainSetup) -> tuple[dict, dict]:
    """Frozen 16-bit (or 4-bit) base plus fp32 adapter weights, grads and AdamW states; a projector trained beside
    them (PEFT's modules_to_save: ``method.train_vision``) is a copy in the base's dtype with its gradient and two
    AdamW states in that dtype too (measured: PEFT keeps the copy bf16 in a bf16 run)."""
    P, T = spec.params, lora_params(spec, s)
    wb = 2 if s.method == "qlora" else s.weight_width  # QLoRA: the parts it does not quantise are 16-bit
    whole = {"vision_states": 4 * wb * pictures.trainable(spec, s)[0]}
    if s.method == "qlora":  # 4-bit Linears with their quantisation state; embeddings, head and norms 16-bit
        weights = saver_memory.qlora_weight_bytes(spec) - pictures.qlora_vision_bytes_saved(spec, s)
        return {"weights": weights, "dequant_buffer": saver_memory.dequant_buffer_bytes(spec),
                "adapter_states": LORA_TRAINABLE_BYTES * T, **whole}, {}
    return {"weights": wb * P, "adapter_states": LORA_TRAINABLE_BYTES * T, **whole}, {}


def layer_activation_bytes(spec: ModelSpec, s: TrainSetup) -> int:
    """Bytes autograd saves in one decoder layer for the whole micro-batch (no checkpointing).

    16-bit: s·b·(20h + 4h_kv + 8I + 4a) with SDPA (the 4a is its fp32 log-sum-exp); eager
    attention adds the fp32 and 16-bit softmax (6·a·s² per sample) and the repeated K/V.
    Every coefficient was checked with saved-tensor hooks (tests/test_memory.py)."""
    h, hkv, inter, a = spec.hidden, spec.kv_width, spec.intermediate, spec.heads
    tokens = s.micro_batch * s.seq_len
    if s.method in ("lora", "qlora"):
        # frozen Linears and norm weights save no inputs: only the fp32 norm inputs, RoPE'd q/k, v,
        # the gated-MLP products and the adapters' own (fp32) inputs remain
        per = 14 * h + 4 * hkv + 6 * inter + 4 * a + _lora_activation_per_token(spec, s)
    elif s.precision == "fp32":
        per = 32 * h + 8 * hkv + 16 * inter + 4 * a  # norms keep 3 fp32 copies, the rest doubles
    elif not s.weights_16bit:
        per = 32 * h + 4 * hkv + 8 * inter  # autocast: fp32 residual stream, 16-bit copies per Linear
    else:
        per = 20 * h + 4 * hkv + 8 * inter + 4 * a
    if s.attn == "eager":
        width = s.activation_width
        per += (4 + width) * a * s.seq_len + 2 * width * (h - hkv) - 4 * a
    mask = packed_mask.per_layer_bytes(s, spec.heads * spec.head_dim, hkv)
    if s.mlp_tiled(spec):
        return tokens * tiled_layer_per_token(spec, s) + mask
    return tokens * (per + _family_layer_delta(spec, s)) + mask


def _family_layer_delta(spec: ModelSpec, s: TrainSetup) -> int:
    """Per-token, per-layer difference of a family from the Llama layout (fitted on saved-tensor
    measurements of shrunk models, bf16): Gemma 2 has four fp32 norms and tanh soft-capped scores
    (eager only); StableLM's and Phi's LayerNorms keep less than Llama's fp32 RMSNorm copies, and
    Phi's non-gated MLP keeps its gelu input and output. GPT-2 is not fitted (Llama layout used)."""
    if spec.family == "gemma2":
        return 21 * spec.hidden + (2 * spec.heads * s.seq_len if s.attn == "eager" else 0)
    if spec.family == "stablelm":
        return -6 * spec.hidden
    if spec.family == "phi":  # one LayerNorm, non-gated gelu MLP
        return 2 * spec.intermediate - 6 * spec.hidden
    return 0


def _lora_activation_per_token(spec: ModelSpec, s: TrainSetup) -> int:
    """Bytes per token one (typical) layer's adapters keep (``adapters.activation_per_token``)."""
    return adapters.activation_per_token(s, spec.typical_linears, tiled=s.mlp_tiled(spec))


def autocast_weight_bytes(spec: ModelSpec, s: TrainSetup) -> int:
    """Autocast over fp32 weights keeps a 16-bit copy of every Linear's weight for backward
    (inside checkpointed layers they are rebuilt, so then only the lm_head's copy stays)."""
    if s.precision == "fp32" or s.weights_16bit or s.method != "full" or not spec.fitted:
        return 0  # measured architectures: the copies are in their measured constants
    layers = 0 if s.checkpointing else spec.layers * sum(i * o for i, o in spec.linear_shapes)
    return 2 * (layers + spec.vocab * spec.hidden)


def _head_per_token(spec: ModelSpec, s: TrainSetup) -> int:
    """Final norm (+ lm_head input when lm_head trains) and the fp32 log-softmax, per token."""
    h = spec.hidden
    if s.method in ("lora", "qlora"):
        norm = 4 * h  # frozen norm weight and lm_head: only the fp32 norm input is kept
    elif s.precision == "fp32":
        norm = 12 * h
    elif not s.weights_16bit:
        norm = 14 * h  # fp32 norm copies + the lm_head's 16-bit input
    else:
        norm = 8 * h
    if spec.family in LAYERNORM_HEAD_FAMILIES:
        norm -= 4 * h  # their final LayerNorm keeps less than Llama's fp32 RMSNorm copies
    if s.objective == "grpo":  # what the fused head keeps for its scored tokens: grpo_memory.head_scored_bytes
        return norm
    if s.fused_head:  # TRL's chunked log-probs keep the head's input, log Z, entropy (fp32) and the targets (int64)
        return norm + FUSED_HEAD_PER_TOKEN
    if not s.full_logits:  # the head's input gradient, computed in the loss's forward (16-bit, or fp32), and the
        # int64 row index of each labelled token (Liger: an fp32 loss per token); for a full fine-tune the lm_head's
        # input counted in ``norm`` is not kept (the gradient takes its place)
        kept = 0 if s.method == "full" else s.activation_width * h
        return norm + kept + 8
    softcap = 2 * spec.vocab if spec.family in SOFTCAPPED_FAMILIES else 0  # tanh's output, kept for its derivative
    return norm + 4 * spec.vocab + softcap


def activation_bytes(spec: ModelSpec, s: TrainSetup) -> dict:
    """Saved activations: ``layers`` (all decoder layers, or their checkpointed inputs),
    ``head`` (final norm, lm_head input, fp32 log-softmax), ``recompute`` (one layer rebuilt
    during backward when checkpointing)."""
    if spec.encoder_decoder:
        return seq2seq_activation_bytes(spec, s)
    if s.sequences_per_sample > 1:  # chosen and rejected go through the model in one batch
        s = s.but(micro_batch=s.micro_batch * s.sequences_per_sample)
    acts = _text_activation_bytes(spec, s)
    if s.pictures:  # the vision tower's saved tensors; its checkpointed block rebuilt in backward (not beside the
        # text layer's: the tower's backward runs after the text model's)
        acts["vision"] = pictures.activation_bytes(spec, s)
        acts["recompute"] = max(acts["recompute"], pictures.recompute_bytes(spec, s))
    return acts


def _text_activation_bytes(spec: ModelSpec, s: TrainSetup) -> dict:
    if not spec.fitted:  # every architecture without a hand-fitted formula: its record's measured coefficients
        acts = measured.activation_bytes(spec, s)
        if s.objective == "grpo":
            acts["head"] += grpo_memory.head_scored_bytes(spec, s)
        return acts
    tokens = s.micro_batch * s.seq_len
    layer = layer_activation_bytes(spec, s)
    head = tokens * _head_per_token(spec, s) + autocast_weight_bytes(spec, s)
    if s.objective == "grpo":
        head += grpo_memory.head_scored_bytes(spec, s)
    if s.checkpointing:
        return {"layers": spec.layers * tokens * s.stream_width * spec.hidden, "head": head,
                "recompute": layer - tiled_input_bytes(spec, s)}
    layers = spec.layers * layer
    if s.method in ("lora", "qlora") and not s.mlp_tiled(spec):
        # the frozen embedding's output needs no gradient, so the first layer keeps ≈17.5·h bytes
        # per token less (measured; checkpointing turns input gradients on, so not there)
        layers -= tokens * (35 * spec.hidden // 2)
    return {"layers": layers, "head": head, "recompute": 0}


def _mask_in_layers(spec: ModelSpec, s: TrainSetup, acts: dict, breakdown: dict) -> int:
    """Bytes of ``breakdown``'s activations and recompute that are the attention mask's per-layer part (its 16-bit
    bias and the repeated K/V each SDPA layer keeps: ``packed_mask.per_layer_bytes``), taken out of them (the
    ``attention_mask`` component holds them beside the shared mask, so the mask's cost has one home); the peak and
    the churn are unchanged (offloaded layers: the share of the one layer in flight on the GPU)."""
    if not packed_mask.applies(s) or spec.encoder_decoder:
        return 0
    plain = activation_bytes(spec, s.but(packed_mask=False))
    layers = acts["layers"] - plain["layers"]
    if offloaded_activation_bytes(spec, s, acts):
        on_gpu = (offload_device_bytes(spec, s, a)["activations"] for a in (acts, plain))
        layers = next(on_gpu) - next(on_gpu)
    layers = max(0, layers)
    recompute = max(0, acts["recompute"] - plain["recompute"])
    breakdown["activations"] -= layers
    breakdown["recompute"] -= recompute
    return layers + recompute


def offloaded_activation_bytes(spec: ModelSpec, s: TrainSetup, acts: dict) -> int:
    """Bytes of saved activations TRL's activation offloading copies to pinned host RAM per micro-batch: every
    decoder layer's (or checkpointed input's) saved tensors. The head's stay on the GPU (TRL keeps the output
    Linear's tensors there)."""
    if not s.activation_offload or s.device != "cuda" or spec.encoder_decoder:
        return 0
    if s.checkpointing:  # the checkpointed inputs, in the worker's pinned blocks
        return saver_memory.offloaded_checkpoint_bytes(spec.layers, acts["layers"] // spec.layers)
    return acts["layers"]


def offload_device_bytes(spec: ModelSpec, s: TrainSetup, acts: dict) -> dict:
    """What activation offload still holds on the GPU for the layers: ``activations`` one layer's worth in flight
    (the forward stash of five tensors, or the layers brought back for backward), ``offload_kept`` the storages
    saved twice (``saver_memory.offload_kept_bytes``) and ``offload_margin`` (unmeasured, ``OFFLOAD_MARGIN``).
    With checkpointing the offloaded tensors are the checkpointed layers' inputs: ``saver_memory.CHECKPOINTS_ON_GPU``
    of them stay on the GPU at once (``offloaded_checkpoints``)."""
    if s.checkpointing:
        return {"activations": saver_memory.CHECKPOINTS_ON_GPU * acts["layers"] // spec.layers}
    kept = saver_memory.offload_kept_bytes(spec, s)
    return {"activations": acts["layers"] // spec.layers, "offload_kept": kept,
            "offload_margin": int(saver_memory.OFFLOAD_MARGIN * acts["layers"])}


def logits_bytes(spec: ModelSpec, s: TrainSetup) -> int:
    """Loss transient beyond the saved fp32 log-softmax (4·b·s·V, counted in the head's activations).
    The peak is in the loss's backward: the gradient arriving from the NLL and the one log-softmax's
    backward produces (4 bytes each) beside the saved output — 12·b·s·V in all. (The forward's
    16-bit logits + fp32 upcast + log-softmax are 10·b·s·V, and the logits are freed once the loss
    is taken.) The first estimate said ≈14 (docs/design.md, "Memory, per component"); peak allocations
    measured on an H100 fit 12 within 4% across Llama, Qwen and SmolLM vocabularies (docs/benchmarks.md)."""
    tokens = s.micro_batch * s.sequences_per_sample * s.seq_len
    if s.objective == "grpo":  # completion tokens only, in tiles; the LM head's fp32 gradient when it trains
        return grpo_memory.logprob_bytes(spec, s, lm_head_trains=s.method == "full")
    if s.fused_head and not spec.encoder_decoder:  # fp32 logits of one tile at a time, with their gradient
        return 8 * min(tokens, FUSED_TOKEN_TILE) * min(spec.vocab, FUSED_VOCAB_CHUNK)
    if not s.full_logits:
        return _chunked_logits_bytes(spec, s, tokens)
    return 8 * tokens * spec.vocab


def _chunked_logits_bytes(spec: ModelSpec, s: TrainSetup, tokens: int) -> int:
    """The loss's working memory without full logits: one chunk's logits and the gradients computed from them
    (bytes per logit above; Liger works on its 16-bit chunk in place), plus the LM head's weight gradient, which
    both kernels compute in the loss's forward and hold (16-bit, or fp32) until backward hands it on."""
    head_grad = s.weight_width * spec.vocab * spec.hidden if s.method == "full" else 0
    if s.loss_kernel == "liger":
        return 2 * liger_chunk_tokens(tokens, spec.vocab, spec.hidden) * spec.vocab + head_grad
    per_logit = CHUNK_BYTES_PER_LOGIT + (SOFTCAP_BYTES_PER_LOGIT if spec.family in SOFTCAPPED_FAMILIES else 0)
    return per_logit * min(tokens, loss_chunk_tokens(spec.vocab)) * spec.vocab + head_grad


def tied_gradients(spec: ModelSpec, s: TrainSetup, later: int) -> int:
    """The tied embeddings' extra weight gradients (``optimizer_memory.tied_gradient_bytes``) beyond what is freed
    by the end of backward, when they are alive: the activations, recompute, tiles, mask and the loss's transients
    (``later``) are gone then, except the LM head's weight gradient the chunked loss holds from its forward (it is
    the gradient the engine buffers). Zero wherever those transients are larger: the peak is earlier in backward."""
    extra = optimizer_memory.tied_gradient_bytes(spec, s)
    if not extra or s.deepspeed:
        return 0
    held = s.weight_width * spec.vocab * spec.hidden if not s.full_logits and s.objective == "sft" else 0
    return max(0, extra - (later - held))


def flatten_cache_bytes(spec: ModelSpec, s: TrainSetup) -> int:
    """ZeRO-1/2 copy the 16-bit weights into one flat buffer while the per-parameter tensors still
    exist (the engine's start peaks at two copies, 4·P bytes, measured); the freed per-parameter
    blocks stay in PyTorch's cache and are only partly reused by activations: one copy, 2·P."""
    if s.deepspeed and s.device == "cuda" and s.zero_stage in (1, 2) and s.method == "full":
        return 2 * spec.trainable_params
    return 0


def bucket_bytes(spec: ModelSpec, s: TrainSetup) -> int:
    """DeepSpeed communication buckets on the GPU (16-bit elements). HF's 'auto' sizes them
    from hidden²; overlap_comm double-buffers them."""
    if not (s.deepspeed and s.device == "cuda"):
        return 0
    h2 = spec.hidden * spec.hidden
    if s.zero_stage == 3:
        buckets = h2 + int(0.9 * h2)  # reduce bucket + prefetch bucket
    else:
        buckets = 2 * min(h2, spec.params)  # reduce + allgather
    return 2 * buckets * (2 if s.overlap_comm else 1)


def fragmentation_share(s: TrainSetup) -> float:
    """The allocator slack's share of the churning bytes for this setup (see FRAGMENTATION)."""
    if s.deepspeed and s.device == "cuda" and s.zero_stage == 3:
        return FRAGMENTATION_ZERO3
    return FRAGMENTATION_CHECKPOINTING if s.checkpointing else FRAGMENTATION


def estimate(spec: ModelSpec, s: TrainSetup) -> Estimate:
    """Predicted peak device memory and host RAM for one GPU (or the CPU when device is cpu)."""
    spec = pictures.with_trained_vision(spec, s)
    states, host_states = model_states(spec, s)
    acts = activation_bytes(spec, s)
    breakdown = dict(states)
    ref_device, ref_host = reference_bytes(spec, s)
    breakdown["reference_model"] = ref_device
    breakdown["reference_forward"] = objective_transient_bytes(spec, s)
    if ref_host:
        host_states = dict(host_states, reference_model=ref_host)
    offloaded = offloaded_activation_bytes(spec, s, acts)
    if offloaded:
        host_states = dict(host_states, offloaded_activations=offloaded)
        on_gpu = offload_device_bytes(spec, s, acts)
        breakdown["activations"] = on_gpu.pop("activations") + acts["head"]
        breakdown.update(on_gpu)
    else:
        breakdown["activations"] = acts["layers"] + acts["head"]
    breakdown["recompute"] = acts["recompute"]
    in_layers = _mask_in_layers(spec, s, acts, breakdown)  # the layers' share of the mask: its one component
    breakdown["vision_activations"] = acts.get("vision", 0)
    breakdown["mlp_tile"] = mlp_tile_bytes(spec, s)
    breakdown["attention_mask"] = 0 if spec.encoder_decoder else packed_mask.shared_bytes(s) + in_layers
    breakdown["logits_loss"] = logits_bytes(spec, s)
    later = breakdown["activations"] + breakdown["recompute"] + breakdown["vision_activations"] + \
        breakdown["mlp_tile"] + breakdown["attention_mask"] + breakdown["logits_loss"]
    breakdown["vision_forward"] = max(0, pictures.forward_bytes(spec, s) - later)  # only where it is the peak
    breakdown["tied_gradients"] = tied_gradients(spec, s, later)
    breakdown["deepspeed_buckets"] = bucket_bytes(spec, s)
    breakdown["deepspeed_flatten_cache"] = flatten_cache_bytes(spec, s)
    moments = {}
    if s.in_backward and not s.deepspeed:
        breakdown, moments = in_backward_memory.at_largest_moment(
            breakdown, in_backward_memory.fused_step_moments(spec, s, acts, breakdown), FUSED_TRANSIENTS)
    churn = sum(breakdown.get(k, 0) for k in CHURN)
    breakdown["fragmentation"] = int(fragmentation_share(s) * churn)
    breakdown.update(saver_memory.runtime_bytes(s))
    breakdown = {k: int(v) for k, v in breakdown.items() if v}
    phases, by_phase = {}, {}
    if s.objective == "grpo" and not spec.encoder_decoder:
        breakdown, phases, by_phase = _grpo_phases(spec, s, states, breakdown)
    # per machine: each of its ranks (gpus_per_node processes) has its own runtime and loads the weights itself;
    # offloaded states are already the machine's share
    ranks = max(1, s.gpus_per_node)
    host = {"runtime": RUNTIME_HOST_BYTES * ranks, **{k: int(v) for k, v in host_states.items()}}
    # weights pass through host memory once while loading (16-bit checkpoint shards)
    host["loading"] = 2 * spec.params if s.method != "qlora" else saver_memory.qlora_weight_bytes(spec)
    if ref_device or ref_host:  # the reference copy is made from the loaded weights
        host["loading"] *= 2
    host["loading"] *= ranks
    if s.device == "cpu":
        host["training"] = sum(breakdown.values()) * ranks
    trainable = spec.trainable_params if s.method == "full" else lora_params(spec, s) + pictures.trainable(spec, s)[0]
    notes = []
    if s.deepspeed and placement(s.optimizer).eight_bit:
        notes.append("DeepSpeed uses its own optimizer: 8-bit AdamW is ignored under DeepSpeed")
    cards, unsplit = (), {}
    if s.split_over and s.device == "cuda":
        cards = tuple(c.to_dict() for c in _split(spec, s, breakdown, acts))
        breakdown, unsplit = dict(layer_split.fullest(cards)["breakdown"]), breakdown
    return Estimate(breakdown, int(sum(breakdown.values())) if s.device == "cuda" else 0, host,
                    int(sum(host.values())), trainable, tuple(notes), phases, by_phase, moments, cards, unsplit)


def _split(spec: ModelSpec, s: TrainSetup, breakdown: dict, acts: dict) -> list:
    """Each card's share of ``breakdown`` (one card holding the whole model) with the layers split over
    ``s.split_over``'s cards (``planning/layer_split``)."""
    width = 2 if s.method == "qlora" else s.weight_width  # QLoRA's embeddings and head stay 16-bit
    tied = layer_split.head_first(spec)
    parts = layer_split.Parts(breakdown, width * spec.embedding_params, 0 if tied else width * spec.lm_head_params,
                              acts["head"], packed_mask.shared_bytes(s), fragmentation_share(s), CHURN)
    return layer_split.split(parts, spec.layers, s.split_over, tied, s.split_layers or None)


# The components that churn every step (allocated and freed within it): the fragmentation margin is a share of them
CHURN = ("activations", "recompute", "vision_activations", "mlp_tile", "attention_mask", "logits_loss",
         "vision_forward", "reference_forward", "gradients", "in_backward_workspace", "zero3_gather", "offload_kept",
         "tied_gradients", "layer_backward")
# Of those, what the fused step's moments hold (``in_backward_memory.fused_step_moments``); every other component is
# held all the step
FUSED_TRANSIENTS = frozenset(CHURN) | {"offload_margin"}


PERSISTENT = ("reference_model", "deepspeed_buckets", "deepspeed_flatten_cache", "cuda_context", "cuda_kernels")


def _grpo_phases(spec: ModelSpec, s: TrainSetup, states: dict, update: dict) -> tuple[dict, dict, dict]:
    """GRPO's peak is the larger of its sampling phase and its update (the breakdown above, at micro-batch ×
    seq_len): (the peak phase's breakdown, bytes per phase, breakdown per phase)."""
    persistent = {k: update[k] for k in PERSISTENT if k in update}
    sampling = grpo_memory.sampling_phase(spec, s, states, persistent, lora_params(spec, s) if s.method != "full" else 0)
    by_phase = {"sampling": sampling, "update": update}
    phases = {k: int(sum(v.values())) for k, v in by_phase.items()}
    return by_phase[max(phases, key=phases.get)], phases, by_phase
