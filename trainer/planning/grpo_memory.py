"""GRPO's memory (bytes): the sampling phase and the update phase's own terms. No torch.

TRL 1.16's ``GRPOTrainer`` (transformers ``generate``, no vLLM) runs two phases on one GPU:

- **sampling**, at the start of every ``steps_per_generation`` micro-batches: ``generate`` over the whole
  generation batch at once (left-padded prompts, then one token per step with a KV cache), then, with
  ``beta > 0``, the reference log-probs in chunks of micro-batch size without gradients. Between them the
  cache is released, so the phase peaks at the larger of the two. No activations are held; gradients are
  None when the pass starts an optimizer step (HF's Trainer zeroes them with ``set_to_none``) and are still
  held when it runs mid-step (a generation batch smaller than the step's completions).
- **update**: the SFT-style forward/backward of one micro-batch of prompt + completion (``data.seq_len``
  at most), through TRL's fused LM head (``add_fused_lm_head``): only positions with a label are scored —
  the completion tokens on CUDA (``hidden[mask]``), every position on the CPU (no Triton) — in tiles of
  4096 tokens × 32768 vocabulary entries, so the ``[tokens × vocabulary]`` logits never exist. With
  ``num_iterations == 1`` and ``steps_per_generation`` dividing the accumulation (our rule), TRL computes no
  ``old_per_token_logps``: no extra forward. With ``grpo.num_iterations`` above 1 it does, in the sampling phase,
  in chunks of micro-batch size without gradients: the same shape as the reference scoring (one at a time).

Checked on the CPU in tests/test_grpo_memory.py: the KV cache against ``generate``'s returned cache
tensors, the update's saved activations against saved-tensor hooks around TRL's own ``_compute_loss``.
The prefill's transient and the last-token logits are counted from the shapes the code allocates
(not measured: the CPU has no allocator peak to read).
"""
from __future__ import annotations

FUSED_TOKEN_TILE, FUSED_VOCAB_CHUNK = 4096, 32768  # trl.kernels.chunked_logprob tiles (tokens × vocabulary)
SCORED_PER_TOKEN = 16  # the fused head keeps, per scored token: int64 target, fp32 log Z and fp32 entropy
LOSS_PER_COMPLETION_TOKEN = 20  # GRPO's loss keeps ~5 fp32 [micro × completion] tensors (ratio, clip, mask...)
# generate's last-token logits per sequence and vocabulary entry: the model's 16-bit logits, their fp32
# copy (``.to(copy=True, dtype=float32)``), the processed scores (temperature) and softmax's probabilities
SAMPLING_LOGIT_BYTES = 2 + 4 + 4 + 4
SAMPLING_FRAGMENTATION = 0.10  # the cache grows by torch.cat: like the plain step's churn (not measured on a GPU)


def completions_per_step(s) -> int:
    """Completions one GPU trains on per optimizer step (micro-batch × accumulation)."""
    return s.micro_batch * s.gradient_accumulation


def generation_batch(s) -> int:
    """Completions sampled at once per GPU: the setup's, else one sampling pass per optimizer step."""
    return s.generation_batch or completions_per_step(s)


def prompt_tokens(s) -> int:
    """The longest prompt: the planned sequence length (data.seq_len, or the data's longest prompt + the longest
    completion: ``token_stats.planned_length``) minus room for the longest completion (TRL pads prompts to the
    longest)."""
    return max(1, s.seq_len - s.max_completion_length)


def kv_bytes_per_token(spec, s) -> int:
    """K and V of every attention layer for one token (linear-attention and convolution layers keep a fixed-size
    state): 2 × layers × kv width × the compute dtype (16-bit under autocast or 16-bit weights; fp32 only when
    training in fp32)."""
    return 2 * spec.attention_layers * spec.kv_width * s.activation_width


def kv_cache_bytes(spec, s, tokens: int) -> int:
    """The KV cache of the whole generation batch holding ``tokens`` tokens per sequence."""
    return generation_batch(s) * tokens * kv_bytes_per_token(spec, s)


def _layer_transient_per_token(spec, s) -> int:
    """One layer's intermediates in a forward without gradients (hidden, q/k/v, the MLP's three I-wide tensors):
    the same per-token figure the planner uses for DPO's reference forward."""
    return s.activation_width * (3 * spec.hidden + 2 * spec.kv_width + 3 * spec.intermediate)


def prefill_bytes(spec, s) -> int:
    """The prompts' forward in ``generate``: one layer's intermediates for every prompt token, the padding mask
    (one byte per query × key position, SDPA) and the last token's logits (generate keeps only those)."""
    g, p = generation_batch(s), prompt_tokens(s)
    return g * p * _layer_transient_per_token(spec, s) + g * p * p + g * spec.vocab * SAMPLING_LOGIT_BYTES


def decode_bytes(spec, s) -> int:
    """One decoding step at the full length: the cache's torch.cat holds one layer's old and new keys (or
    values) at once, plus the step's logits."""
    g = generation_batch(s)
    one_layer = g * s.seq_len * spec.kv_width * s.activation_width
    return one_layer + g * spec.vocab * SAMPLING_LOGIT_BYTES


def generation_peak_point(spec, s) -> str:
    """Where generate peaks: ``"prefill"`` (the prompts' cache and the prefill's transient) or ``"decode"`` (the
    whole cache and a decoding step at the last token)."""
    prefill = kv_cache_bytes(spec, s, prompt_tokens(s)) + prefill_bytes(spec, s)
    decode = kv_cache_bytes(spec, s, s.seq_len) + decode_bytes(spec, s)
    return "prefill" if prefill >= decode else "decode"


def generation_terms(spec, s) -> dict:
    """``generation_kv_cache`` and ``generation_forward`` at generate's peak (``generation_peak_point``)."""
    if generation_peak_point(spec, s) == "prefill":
        return {"generation_kv_cache": kv_cache_bytes(spec, s, prompt_tokens(s)), "generation_forward": prefill_bytes(spec, s)}
    return {"generation_kv_cache": kv_cache_bytes(spec, s, s.seq_len), "generation_forward": decode_bytes(spec, s)}


def reference_scoring_bytes(spec, s) -> int:
    """With beta > 0 (the reference's log-probs) or num_iterations > 1 (the old policy's): one micro-batch scored
    without gradients (one layer's intermediates and one fused-head tile); 0 when nothing is scored."""
    if s.beta <= 0 and s.num_iterations <= 1:
        return 0
    tokens = s.micro_batch * s.seq_len
    tile = 2 * min(scored_tokens(s), FUSED_TOKEN_TILE) * min(spec.vocab, FUSED_VOCAB_CHUNK)
    return tokens * _layer_transient_per_token(spec, s) + tile


def scored_tokens(s) -> int:
    """Tokens TRL's fused head scores per micro-batch: the completion's on CUDA, every position on the CPU."""
    if s.device == "cuda":
        return s.micro_batch * s.max_completion_length
    return s.micro_batch * (s.seq_len - 1)


def head_scored_bytes(spec, s) -> int:
    """Saved for the fused head's backward beyond the final norm: per scored token the target, log Z and
    entropy, plus the head's input when it is a copy (CUDA gathers the scored rows; on the CPU a micro-batch
    above 1 makes ``[:, :-1]`` non-contiguous), plus the loss's fp32 per-completion-token tensors."""
    width = s.activation_width
    copied = s.device == "cuda" or s.micro_batch > 1
    per = SCORED_PER_TOKEN + (width * spec.hidden if copied else 0)
    return scored_tokens(s) * per + s.micro_batch * s.max_completion_length * LOSS_PER_COMPLETION_TOKEN


def logprob_bytes(spec, s, lm_head_trains: bool) -> int:
    """The fused head's working memory at its backward: one logits tile, its fp32 copy in the CPU fallback,
    the fp32 gradient of the scored hidden states, and (when the LM head trains) its fp32 weight gradient
    plus the 16-bit cast TRL returns."""
    n = scored_tokens(s)
    tile = min(n, FUSED_TOKEN_TILE) * min(spec.vocab, FUSED_VOCAB_CHUNK) * (2 if s.device == "cuda" else 8)
    weight_grad = 6 * spec.vocab * spec.hidden if lm_head_trains else 0
    return tile + 4 * n * spec.hidden + weight_grad


def sampling_phase(spec, s, states: dict, persistent: dict, lora_trainable: int) -> dict:
    """The sampling phase's breakdown (device bytes): model states (gradients dropped when the pass starts the
    optimizer step), the reference copy and DeepSpeed's persistent buffers (``persistent``), then the larger
    of generate (KV cache + forward) and the reference scoring."""
    out = dict(states)
    if generation_batch(s) >= completions_per_step(s) and not s.deepspeed:
        out.pop("gradients", None)
        if "adapter_states" in out:  # fp32 adapter gradients (4 bytes each) are None between steps too
            out["adapter_states"] -= 4 * lora_trainable
    out.update(persistent)
    if s.deepspeed and s.zero_stage == 3 and s.device == "cuda":
        out["zero3_generation_gather"] = 2 * spec.params  # TRL gathers the whole model for generate by default
    gen = generation_terms(spec, s)
    ref = reference_scoring_bytes(spec, s)
    if ref > sum(gen.values()):
        out["reference_forward" if s.beta > 0 else "old_policy_forward"] = ref
        churn = ref
    else:
        out.update(gen)
        churn = sum(gen.values())
    out["fragmentation"] = int(SAMPLING_FRAGMENTATION * churn)
    return {k: int(v) for k, v in out.items() if v}
