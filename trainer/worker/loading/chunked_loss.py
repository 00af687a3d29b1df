"""Worker side: the causal-LM loss without the full ``[tokens × vocabulary]`` logits.

HF's causal LMs compute ``lm_head(hidden)`` for every token, upcast it to fp32 and take the cross-entropy:
about 12 bytes per token per vocabulary entry at the loss's backward (docs/planner.md), more than the
weights of a 0.5B model at sequence 1024 with Qwen's 151,936-token vocabulary. Here the decoder runs as
before, then only the tokens that carry a label go through the LM head and the cross-entropy, in chunks of
``loss_chunk_tokens(V)`` tokens; each chunk is a non-reentrant checkpoint (``torch.utils.checkpoint``), so its
logits are freed after its loss is taken and recomputed in backward. Exact: the same per-token
cross-entropy as ``transformers.loss.loss_utils.ForCausalLMLoss`` (labels shifted by one, ``-100`` ignored,
fp32 logits), summed and divided by ``num_items_in_batch`` when the Trainer passes it (the token-normalised
loss across accumulated micro-batches) or by the count of labelled tokens otherwise. Only the order of the
fp32 summation differs.

The model's ``forward`` is replaced on the instance (as HF's ``use_liger_kernel`` integration patches a
model with Liger's fused linear cross-entropy), so every wrapper — PEFT, DeepSpeed, the Trainer — calls it
unchanged. Calls without labels (generation, TRL's preference trainers) take the original forward.
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from trainer.planning.memory import CHUNKED_LOSS_FAMILIES, LIGER_FAMILIES, SEQ2SEQ_CHUNKED_FAMILIES, loss_chunk_tokens

IGNORE_INDEX = -100  # HF's label for "not trained"


def loss_path(chunked: bool, device: str, model_type: str | None, liger_installed: bool) -> str:
    """Which loss the run uses: ``"liger"`` (Liger's fused kernels through HF's ``use_liger_kernel``: CUDA,
    ``liger-kernel`` and Triton importable, a family Liger supports), ``"chunked"`` (ours, any device, where
    exact) or ``"hf"`` (HF's loss: ``speed.chunked_loss`` false, or a family where chunking is not exact)."""
    if not chunked:
        return "hf"
    if device == "cuda" and liger_installed and model_type in LIGER_FAMILIES:
        return "liger"
    return "chunked" if model_type in CHUNKED_LOSS_FAMILIES | SEQ2SEQ_CHUNKED_FAMILIES else "hf"


def liger_installed() -> bool:
    """Whether liger-kernel and Triton can be imported here (found without importing them)."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("liger_kernel", "triton"))


def supported(model) -> bool:
    """Whether the chunked loss is exact for ``model`` (the bare PreTrainedModel): a decoder-only family
    whose head is a plain ``lm_head`` on ``self.model``'s last hidden state and whose loss is HF's
    ``ForCausalLM`` (no soft-capped or scaled logits)."""
    return getattr(model.config, "model_type", None) in CHUNKED_LOSS_FAMILIES and \
        hasattr(model, "model") and hasattr(model, "lm_head")


def install(model) -> bool:
    """Make ``model`` (a causal LM or T5, or a PEFT model around one) compute its training loss in chunks.
    Returns False (nothing changed) where that would not be exact."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base.config, "model_type", None) in SEQ2SEQ_CHUNKED_FAMILIES:
        return _install_seq2seq(base)
    if not supported(base):
        return False
    original = base.forward

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
        if labels is None and kwargs.get("shift_labels") is None:
            return original(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
                            logits_to_keep=logits_to_keep, **kwargs)
        return _forward_with_loss(self, dict(input_ids=input_ids, attention_mask=attention_mask,
                                             position_ids=position_ids, past_key_values=past_key_values,
                                             inputs_embeds=inputs_embeds, use_cache=use_cache), labels, kwargs)

    base.forward = types.MethodType(forward, base)
    base.tp_chunked_loss = True
    return True


def _install_seq2seq(base) -> bool:
    """T5: the encoder and decoder as HF runs them, then the chunked loss over the (scaled) decoder output.
    T5's own loss is the mean over labelled target tokens (it ignores ``num_items_in_batch``): kept so."""
    original = base.forward

    def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None, decoder_attention_mask=None,
                encoder_outputs=None, past_key_values=None, inputs_embeds=None, decoder_inputs_embeds=None,
                labels=None, use_cache=None, **kwargs):
        args = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
                    decoder_attention_mask=decoder_attention_mask, encoder_outputs=encoder_outputs,
                    past_key_values=past_key_values, inputs_embeds=inputs_embeds,
                    decoder_inputs_embeds=decoder_inputs_embeds, use_cache=use_cache)
        if labels is None or encoder_outputs is not None:  # generation, or a caller's own encoder pass
            return original(labels=labels, **args, **kwargs)
        return _seq2seq_with_loss(self, args, labels, kwargs)

    base.forward = types.MethodType(forward, base)
    base.tp_chunked_loss = True
    return True


def _seq2seq_with_loss(model, a: dict, labels, kwargs: dict):
    from transformers.modeling_outputs import Seq2SeqLMOutput

    enc = model.encoder(input_ids=a["input_ids"], attention_mask=a["attention_mask"], inputs_embeds=a["inputs_embeds"],
                        **kwargs)
    dec_ids = a["decoder_input_ids"]
    if dec_ids is None and a["decoder_inputs_embeds"] is None:
        dec_ids = model._shift_right(labels)
    dec = model.decoder(input_ids=dec_ids, attention_mask=a["decoder_attention_mask"],
                        inputs_embeds=a["decoder_inputs_embeds"], past_key_values=a["past_key_values"],
                        encoder_hidden_states=enc.last_hidden_state, encoder_attention_mask=a["attention_mask"],
                        use_cache=a["use_cache"], **kwargs)
    out = dec.last_hidden_state
    if model.config.scale_decoder_outputs:
        out = out * (model.model_dim ** -0.5)
    loss = chunked_causal_lm_loss(out, model.lm_head, None, shift_labels=labels, vocab=model.config.vocab_size)
    return Seq2SeqLMOutput(loss=loss, logits=None, past_key_values=dec.past_key_values,
                           decoder_hidden_states=dec.hidden_states, decoder_attentions=dec.attentions,
                           cross_attentions=dec.cross_attentions, encoder_last_hidden_state=enc.last_hidden_state,
                           encoder_hidden_states=enc.hidden_states, encoder_attentions=enc.attentions)


def _forward_with_loss(model, inputs: dict, labels, kwargs: dict):
    """The decoder, then the chunked loss; ``logits`` is None (it never exists in full)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    outputs = model.model(**inputs, **kwargs)
    loss = chunked_causal_lm_loss(outputs.last_hidden_state, model.lm_head, labels,
                                  num_items_in_batch=kwargs.get("num_items_in_batch"),
                                  shift_labels=kwargs.get("shift_labels"), vocab=model.config.vocab_size)
    return CausalLMOutputWithPast(loss=loss, logits=None, past_key_values=outputs.past_key_values,
                                  hidden_states=outputs.hidden_states, attentions=outputs.attentions)


def chunked_causal_lm_loss(hidden: torch.Tensor, head, labels: torch.Tensor | None, *, vocab: int,
                           num_items_in_batch=None, shift_labels: torch.Tensor | None = None,
                           chunk_tokens: int | None = None) -> torch.Tensor:
    """HF's causal-LM loss of ``head(hidden)`` against ``labels`` (shifted here, as ``ForCausalLMLoss``
    does, unless ``shift_labels`` is given), never holding more than one chunk's logits.

    ``hidden``: ``[batch, seq, h]``; ``head``: the LM head module (called on ``[chunk, h]`` rows, so a LoRA'd
    or biased head works); ``chunk_tokens``: rows per chunk (default ``loss_chunk_tokens(vocab)``)."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
    flat_labels = shift_labels.reshape(-1).to(hidden.device)
    rows = hidden.reshape(-1, hidden.shape[-1])
    keep = (flat_labels != IGNORE_INDEX).nonzero().squeeze(1)  # unlabelled tokens add nothing to loss or grads
    rows, targets = rows.index_select(0, keep), flat_labels.index_select(0, keep)
    step = chunk_tokens or loss_chunk_tokens(vocab)
    total = rows.sum() * 0.0  # zero that keeps the graph when no token is labelled
    for start in range(0, rows.shape[0], step):
        total = total + checkpoint(_chunk_loss, head, rows[start:start + step], targets[start:start + step],
                                   use_reentrant=False)
    if num_items_in_batch is None:
        return total / keep.numel()  # "mean" over labelled tokens (NaN when there are none, as in HF)
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def _chunk_loss(head, rows: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed fp32 cross-entropy of one chunk (its logits live only inside this call)."""
    return F.cross_entropy(head(rows).float(), targets, reduction="sum")
