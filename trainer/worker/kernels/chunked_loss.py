"""Worker side: the run's loss kernel installed (``install_kernel``), and TrainPilot's chunked loss: the
causal-LM loss without the full ``[tokens × vocabulary]`` logits.

Which kernel a run uses is decided once, by the planner (``trainer/planning/loss_kernel.py``), and arrives
as the resolved ``speed.loss_kernel``; this module installs exactly that, and a loaded model that cannot take it
is a ``UserError`` in the planner's words, never a silent switch.

HF's causal LMs compute ``lm_head(hidden)`` for every token, upcast it to fp32 and take the cross-entropy:
about 12 bytes per token per vocabulary entry at the loss's backward (docs/planner.md), more than the
weights of a 0.5B model at sequence 1024 with Qwen's 151,936-token vocabulary. Here the decoder runs as
before, then only the tokens that carry a label go through the LM head and the cross-entropy, in chunks of
``loss_chunk_tokens(V)`` tokens. For a plain ``nn.Linear`` head (every shipped family) each chunk's gradients —
the head's input and weight (and bias) — are computed in the loss's forward, as Liger's fused linear
cross-entropy does, and held until backward scales them by the incoming gradient: no chunk is recomputed, and
the work per token is HF's (one matmul forward, two backward). The per-chunk cross-entropy and its gradient
are one compiled kernel on CUDA (``torch.compile``, shape-dynamic); elsewhere they run eagerly. A head that is
not a plain Linear (a LoRA'd ``lm_head``) or a weight DeepSpeed ZeRO-3 partitions goes through the head module
instead, each chunk a non-reentrant checkpoint (its logits recomputed in backward).

Exact: the same per-token cross-entropy as ``transformers.loss.loss_utils.ForCausalLMLoss`` (labels shifted by
one, ``-100`` ignored, fp32 logits; Gemma's ``final_logit_softcapping`` as ``tanh(logits / cap) * cap`` in fp32,
as Liger applies it), summed and divided by ``num_items_in_batch`` when the Trainer passes it (the
token-normalised loss across accumulated micro-batches) or by the count of labelled tokens otherwise. Only the
order of the fp32 summation differs, and the head's weight gradient is summed chunk by chunk in its dtype (as
autograd summed the checkpointed chunks' before, and as Liger does).

The model's ``forward`` is replaced on the instance (as HF's ``use_liger_kernel`` integration patches a
model with Liger's fused linear cross-entropy), so every wrapper — PEFT, DeepSpeed, the Trainer — calls it
unchanged. Calls without labels (generation, TRL's preference trainers) take the original forward.
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from trainer.core.errors import UserError
from trainer.planning import loss_kernel
from trainer.planning.memory import loss_chunk_tokens

IGNORE_INDEX = -100  # HF's label for "not trained"


def install_kernel(model, cfg, device: str, apply_liger: bool = False) -> str:
    """Give ``model`` (a causal LM or T5, or a PEFT model around one) the resolved ``cfg.speed.loss_kernel``;
    returns it. ``apply_liger``: patch Liger's kernels in here (HF's Trainer does it itself when its
    ``use_liger_kernel`` is on). UserError when this model or machine cannot take the kernel."""
    kernel = cfg.speed.loss_kernel
    if kernel == "auto":  # only an unresolved config (the worker's is resolved): install nothing, the model's own loss
        kernel = loss_kernel.HF
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    found = loss_kernel.problem(kernel, cfg, getattr(base.config, "model_type", None), device)
    if found:
        raise UserError(f"{found.message} (the loaded model is a {getattr(base.config, 'model_type', '?')})",
                        field="speed.loss_kernel")
    if kernel == loss_kernel.CHUNKED and not install(model):
        raise UserError("speed.loss_kernel: chunked: this model's head is not an lm_head on model.model, so the "
                        "chunked loss cannot replace its loss; use hf", field="speed.loss_kernel")
    if kernel == loss_kernel.LIGER and apply_liger:
        from transformers.integrations.liger import apply_liger_kernel

        apply_liger_kernel(model, {})
    base.tp_loss_kernel = kernel
    return kernel


def supported(model) -> bool:
    """Whether the chunked loss is exact for ``model`` (the bare PreTrainedModel): a decoder-only family of
    ``loss_kernel.CHUNKED_FAMILIES`` whose head is an ``lm_head`` on ``self.model``'s last hidden state."""
    return getattr(model.config, "model_type", None) in loss_kernel.CHUNKED_FAMILIES and \
        hasattr(model, "model") and hasattr(model, "lm_head")


def install(model, chunk_tokens: int | None = None) -> bool:
    """Make ``model`` (a causal LM or T5, or a PEFT model around one) compute its training loss in chunks of
    ``chunk_tokens`` tokens (default ``loss_chunk_tokens(vocab)``). Returns False (nothing changed) where that
    would not be exact."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base.config, "model_type", None) in loss_kernel.SEQ2SEQ_CHUNKED_FAMILIES:
        return _install_seq2seq(base, chunk_tokens)
    if not supported(base):
        return False
    original = base.forward
    softcap = getattr(base.config, "final_logit_softcapping", None)

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
        if labels is None and kwargs.get("shift_labels") is None:
            return original(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
                            logits_to_keep=logits_to_keep, **kwargs)
        return _forward_with_loss(self, dict(input_ids=input_ids, attention_mask=attention_mask,
                                             position_ids=position_ids, past_key_values=past_key_values,
                                             inputs_embeds=inputs_embeds, use_cache=use_cache), labels, kwargs,
                                  chunk_tokens, softcap)

    base.forward = types.MethodType(forward, base)
    base.tp_loss_kernel = loss_kernel.CHUNKED
    return True


def _install_seq2seq(base, chunk_tokens: int | None) -> bool:
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
        return _seq2seq_with_loss(self, args, labels, kwargs, chunk_tokens)

    base.forward = types.MethodType(forward, base)
    base.tp_loss_kernel = loss_kernel.CHUNKED
    return True


def _seq2seq_with_loss(model, a: dict, labels, kwargs: dict, chunk_tokens: int | None):
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
    loss = chunked_causal_lm_loss(out, model.lm_head, None, shift_labels=labels, vocab=model.config.vocab_size,
                                  chunk_tokens=chunk_tokens)
    return Seq2SeqLMOutput(loss=loss, logits=None, past_key_values=dec.past_key_values,
                           decoder_hidden_states=dec.hidden_states, decoder_attentions=dec.attentions,
                           cross_attentions=dec.cross_attentions, encoder_last_hidden_state=enc.last_hidden_state,
                           encoder_hidden_states=enc.hidden_states, encoder_attentions=enc.attentions)


def _forward_with_loss(model, inputs: dict, labels, kwargs: dict, chunk_tokens: int | None, softcap):
    """The decoder, then the chunked loss; ``logits`` is None (it never exists in full)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    outputs = model.model(**inputs, **kwargs)
    loss = chunked_causal_lm_loss(outputs.last_hidden_state, model.lm_head, labels,
                                  num_items_in_batch=kwargs.get("num_items_in_batch"),
                                  shift_labels=kwargs.get("shift_labels"), vocab=model.config.vocab_size,
                                  chunk_tokens=chunk_tokens, softcap=softcap)
    return CausalLMOutputWithPast(loss=loss, logits=None, past_key_values=outputs.past_key_values,
                                  hidden_states=outputs.hidden_states, attentions=outputs.attentions)


@torch.compiler.disable  # an outer torch.compile (speed.torch_compile) graph-breaks here: data-dependent sizes
def chunked_causal_lm_loss(hidden: torch.Tensor, head, labels: torch.Tensor | None, *, vocab: int,
                           num_items_in_batch=None, shift_labels: torch.Tensor | None = None,
                           chunk_tokens: int | None = None, softcap: float | None = None) -> torch.Tensor:
    """HF's causal-LM loss of ``head(hidden)`` against ``labels`` (shifted here, as ``ForCausalLMLoss``
    does, unless ``shift_labels`` is given), never holding more than one chunk's logits.

    ``hidden``: ``[batch, seq, h]``; ``head``: the LM head module; ``chunk_tokens``: rows per chunk (default
    ``loss_chunk_tokens(vocab)``); ``softcap``: the model's ``final_logit_softcapping`` (None: none)."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
    weight = getattr(head, "weight", None)
    if _plain_linear(head) and weight.device != hidden.device and weight.device.type != "meta":
        hidden = hidden.to(weight.device)  # the layers split over cards: the fused path reads the head's weight
        # itself, past the hook that would move its input (a tied head sits on the first card, the last layer not)
    flat_labels = shift_labels.reshape(-1).to(hidden.device)
    rows = hidden.reshape(-1, hidden.shape[-1])
    keep = (flat_labels != IGNORE_INDEX).nonzero().squeeze(1)  # unlabelled tokens add nothing to loss or grads
    rows, targets = rows.index_select(0, keep), flat_labels.index_select(0, keep)
    step = chunk_tokens or loss_chunk_tokens(vocab)
    if _plain_linear(head):
        total = _FusedLinearCrossEntropy.apply(rows, head.weight, head.bias, targets, step, softcap,
                                               torch.is_grad_enabled())
    else:
        total = rows.sum() * 0.0  # zero that keeps the graph when no token is labelled
        for start in range(0, rows.shape[0], step):
            total = total + checkpoint(_chunk_loss, head, rows[start:start + step], targets[start:start + step],
                                       softcap, use_reentrant=False)
    if num_items_in_batch is None:
        return total / keep.numel()  # "mean" over labelled tokens (NaN when there are none, as in HF)
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def _plain_linear(head) -> bool:
    """A head whose weight (and bias) the fused path may read directly: exactly ``nn.Linear`` (not a LoRA
    wrapper) with a full weight (DeepSpeed ZeRO-3 partitions parameters and gathers them only inside the
    module's own forward)."""
    return type(head) is torch.nn.Linear and not hasattr(head.weight, "ds_id")


def _chunk_loss(head, rows: torch.Tensor, targets: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """Summed fp32 cross-entropy of one chunk through the head module (its logits live only inside this call)."""
    logits = head(rows).float()
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return F.cross_entropy(logits, targets, reduction="sum")


def _ce_and_grad(logits: torch.Tensor, targets: torch.Tensor, softcap: float | None):
    """(summed fp32 cross-entropy, its gradient with respect to ``logits`` in their dtype) of one chunk.

    Eagerly it works in one fp32 buffer, in place (``logits`` may be overwritten: the caller's temporary): 16-bit
    logits + their fp32 copy + the 16-bit gradient, 8 bytes per logit at most (12 with soft-capping, which keeps
    tanh for its derivative); compiled it is one kernel."""
    z = logits.float()  # logits themselves when they are fp32
    if softcap is not None:
        tanh = z.div_(softcap).tanh_()
        z = tanh * softcap  # Gemma: cap · tanh(x / cap), in fp32, as Liger applies it
    picked = z.gather(1, targets.unsqueeze(1)).squeeze(1)
    top = z.amax(1, keepdim=True)
    z.sub_(top).exp_()
    total = z.sum(1, keepdim=True)
    loss = (top.squeeze(1) + total.log().squeeze(1) - picked).sum()
    grad = z.div_(total)  # the softmax
    grad.scatter_add_(1, targets.unsqueeze(1), torch.full_like(picked, -1.0).unsqueeze(1))
    if softcap is not None:
        grad.mul_(tanh.mul_(tanh).neg_().add_(1.0))  # d(cap·tanh(x/cap))/dx = 1 - tanh²
    return loss, grad.to(logits.dtype)


_compiled_ce = None  # the compiled kernel once built; False when compiling failed here (eager from then on)


def _ce_kernel(device: torch.device):
    """``_ce_and_grad`` as one compiled kernel on CUDA (compiled once, for any chunk size); eager elsewhere
    (inductor's CPU code needs a C++ compiler and seconds to build, for little gain on memory-bound CPU loops) and
    where Triton is missing (PyTorch's Windows CUDA wheels ship none) or compiling fails: the loss is the same."""
    global _compiled_ce
    if device.type != "cuda" or _compiled_ce is False:
        return _ce_and_grad
    if _compiled_ce is None:
        import importlib.util

        if importlib.util.find_spec("triton") is None:
            _compiled_ce = False
            return _ce_and_grad
        _compiled_ce = torch.compile(_ce_and_grad, dynamic=True)
    return _compiled_or_eager


def _compiled_or_eager(logits, targets, softcap):
    """The compiled kernel; if inductor cannot build it here, say so once and run eagerly from then on."""
    global _compiled_ce
    try:
        return _compiled_ce(logits, targets, softcap)
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:  # a Triton/inductor failure (a broken toolchain, an unsupported GPU)
        import warnings

        warnings.warn(f"the chunked loss runs its per-chunk kernel eagerly: torch.compile failed here "
                      f"({type(exc).__name__}: {str(exc)[:200]})", RuntimeWarning, stacklevel=2)
        _compiled_ce = False
        return _ce_and_grad(logits, targets, softcap)


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of ``rows @ weight.T (+ bias)`` against ``targets``, chunk by chunk, with every
    gradient computed in forward; backward scales them by the incoming gradient. The gradients are kept on
    ``ctx`` rather than saved tensors: they are this function's own results (no in-place check is needed), and
    saved-tensor hooks (activation offload) would copy the head's weight gradient to the host and back."""

    @staticmethod
    def forward(ctx, rows, weight, bias, targets, step: int, softcap, grad_mode: bool):
        dev = rows.device.type
        compute = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else rows.dtype
        # forward runs without grad mode: the caller's (eval under no_grad computes no gradient)
        need_x, need_w = grad_mode and rows.requires_grad, grad_mode and weight.requires_grad
        need_b = grad_mode and bias is not None and bias.requires_grad
        with torch.autocast(dev, enabled=False):
            w = weight.to(compute)
            b = bias.to(compute) if bias is not None else None
            grad_x = torch.empty_like(rows) if need_x else None
            grad_w = torch.zeros_like(weight) if need_w else None
            grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=rows.device) if need_b else None
            total = torch.zeros((), dtype=torch.float32, device=rows.device)
            kernel = _ce_kernel(rows.device)
            for start in range(0, rows.shape[0], step):
                x = rows[start:start + step].to(compute)
                logits = x @ w.t() if b is None else torch.addmm(b, x, w.t())
                loss, g = kernel(logits, targets[start:start + step], softcap)
                del logits
                total += loss
                if need_x:
                    grad_x[start:start + step] = (g @ w).to(rows.dtype)
                if need_w:
                    _accumulate(grad_w, g, x)
                if need_b:
                    grad_b += g.float().sum(0)
        ctx.grads = (grad_x, grad_w, grad_b.to(bias.dtype) if need_b else None)
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grads, ctx.grads = ctx.grads, None
        scaled = [g.mul_(grad_total.to(g.dtype)) if g is not None else None for g in grads]
        return scaled[0], scaled[1], scaled[2], None, None, None, None


def _accumulate(grad_w: torch.Tensor, g: torch.Tensor, x: torch.Tensor) -> None:
    """``grad_w += g.T @ x`` in ``grad_w``'s dtype (in place when the dtypes agree)."""
    if g.dtype == grad_w.dtype:
        grad_w.addmm_(g.t(), x)
    else:
        grad_w += (g.t() @ x).to(grad_w.dtype)
