"""Issue 46 item 4: the most gradient bytes alive at once under the worker's ``InBackwardStep``, counted on the CPU, and
the planner's gradient terms held to it exactly.

A tiny bf16 Llama (tied and untied embeddings) trains one step with HF's loss and with the chunked loss; the
optimizer is the worker's ``in_backward_step.InBackwardStep`` over PyTorch's AdamW in HF's two groups. A
``TorchDispatchMode`` sees every tensor backward makes: a tensor shaped like a trained parameter is a gradient (the
batch's shapes are chosen to collide with none), alive until its storage is freed (weak references: the autograd
engine's buffers, ``param.grad`` and the fused hook's release all count). The planner's side is
``optimizer_memory.gradient_bytes`` (what the gradients hold at the peak, beside ``logits_loss``'s LM-head gradient
that the chunked loss holds from its forward) plus ``optimizer_memory.tied_gradient_bytes`` (the plan's
``tied_gradients`` is that less what backward has freed by then).

Why the tied model holds two: the LM head and the embedding are one leaf, reached by two edges of the graph, so the
autograd engine keeps the head's weight gradient in the leaf's input buffer through the whole backward and adds the
embedding's (the last op of backward) to it out of place: three full weight gradients alive at that moment, where an
untied model has handed the head's to its hook and freed it (one)."""
from __future__ import annotations

import weakref

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from trainer.models.spec import spec_from_config  # noqa: E402
from trainer.planning import in_backward_memory, loss_kernel, optimizer_memory  # noqa: E402
from trainer.planning.setup import TrainSetup  # noqa: E402

# batch 2 × 37 tokens: 74 and 37 are no parameter's dimension, so no activation gradient looks like a weight's
BATCH, SEQ = 2, 37
TINY = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=1000, hidden_size=64,
            intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0, bos_token_id=1, eos_token_id=2)


class GradientBytes(TorchDispatchMode):
    """The most bytes of gradient-shaped tensors alive at once (counted by storage: views and in-place adds are
    the same bytes)."""

    def __init__(self, shapes: set, weights: set):
        super().__init__()
        self.shapes, self.weights, self.live, self.now, self.peak = shapes, weights, {}, 0, 0
        self.paused = False  # inside the fused hook: the optimizer's states and temporaries, the norm's copy

    def _free(self, key):
        self.now -= self.live.pop(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not self.paused and isinstance(t, torch.Tensor) and tuple(t.shape) in self.shapes:
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key in self.live or key in self.weights:  # a weight's view (F.linear's transpose) is no gradient
                    continue
                self.live[key] = storage.nbytes()
                self.now += storage.nbytes()
                weakref.finalize(storage, self._free, key)
        self.peak = max(self.peak, self.now)
        return out


def _model(tied: bool, kernel: str, counter_of):
    from trainer.worker.kernels import chunked_loss
    from transformers import AutoConfig, Trainer

    from trainer.worker.loading.in_backward_step import InBackwardStep

    torch.manual_seed(0)
    conf = AutoConfig.for_model(**{**TINY, "tie_word_embeddings": tied})
    model = transformers.AutoModelForCausalLM.from_config(conf, dtype=torch.bfloat16)
    if kernel == loss_kernel.CHUNKED:
        assert chunked_loss.install(model)
    model.train()
    decay = set(Trainer.get_decay_parameter_names(None, model))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in named if n in decay], "weight_decay": 0.01},
              {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]

    class Counted(InBackwardStep):  # the hook's own allocations (states, AdamW's temporaries, the norm's fp32 copy) are
        # the optimizer's, planned apart (optimizer_states, in_backward_workspace): not counted as gradients
        def _step_one(self, param):
            counter = counter_of()
            counter.paused = True
            try:
                super()._step_one(param)
            finally:
                counter.paused = False

    return model, conf, Counted(torch.optim.AdamW(groups, lr=1e-4))


def measured(tied: bool, kernel: str) -> tuple[int, dict]:
    """(the most gradient bytes alive at once in one fused step, the model's config as a dict)."""
    box = []
    model, conf, step = _model(tied, kernel, lambda: box[0])
    ids = torch.randint(3, TINY["vocab_size"], (BATCH, SEQ))
    shapes = {tuple(p.shape) for p in model.parameters() if p.requires_grad}
    counter = GradientBytes(shapes, {p.untyped_storage().data_ptr() for p in model.parameters()})
    box.append(counter)
    with counter:  # forward too: the chunked loss computes the head's weight gradient there
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
    # the fused step ran: every parameter stepped from its hook, no gradient left
    assert all(p.grad is None for p in model.parameters()) and all(o.state for o in step.optimizer_dict.values())
    return counter.peak, conf.to_dict()


def planned(conf: dict, kernel: str) -> int:
    spec = spec_from_config(conf)
    s = TrainSetup(micro_batch=BATCH, seq_len=SEQ, in_backward=True, loss_kernel=kernel)
    grads = optimizer_memory.gradient_bytes(spec, s)
    held_by_loss = 0 if s.full_logits else s.weight_width * spec.vocab * spec.hidden  # in logits_loss
    return grads["gradients"] + held_by_loss + optimizer_memory.tied_gradient_bytes(spec, s)


@pytest.mark.slow  # ~10 s each on 2 cores: every op of a step through a Python dispatch mode
@pytest.mark.parametrize("kernel", [loss_kernel.HF, loss_kernel.CHUNKED])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_the_planned_gradients_are_the_most_alive_at_once_under_the_fused_step(tied, kernel):
    peak, conf = measured(tied, kernel)
    head = 2 * TINY["vocab_size"] * TINY["hidden_size"]  # one bf16 weight gradient of the embedding / LM head
    assert peak == (3 * head if tied else head)  # tied: the buffered head's, the embedding's and their sum
    assert planned(conf, kernel) == peak


def test_the_tied_gradients_are_planned_beyond_what_backward_has_freed_by_then():
    """The separate step: ``tied_gradients`` is the extra less the transients gone by the end of backward, zero
    where a micro-batch's activations are larger (Llama-3.2-3B at 8 × 2048 tokens), the rest where they are not (one
    checkpointed sequence). The fused step plans the end of backward as its own moment
    (``in_backward_memory.fused_step_moments``): the LM head's buffered gradient and the two more, whole, in the breakdown where
    that moment is the largest (one checkpointed sequence), not where another is. None for LoRA (the embedding does
    not train)."""
    from trainer.models.spec import load_model_spec
    from trainer.planning import memory

    spec = load_model_spec("llama-3.2-3b")
    assert spec.tied_embeddings
    s = TrainSetup(micro_batch=1, seq_len=2048, loss_kernel=loss_kernel.CHUNKED, checkpointing=True)
    extra = optimizer_memory.tied_gradient_bytes(spec, s)
    one = 2 * spec.vocab * spec.hidden
    assert extra == 2 * one
    b = memory.estimate(spec, s).breakdown
    gone = sum(b.get(k, 0) for k in ("activations", "recompute", "mlp_tile", "attention_mask", "logits_loss",
                                      "vision_activations")) - one
    assert 0 < b["tied_gradients"] == extra - gone
    assert "tied_gradients" not in memory.estimate(spec, s.but(micro_batch=8, checkpointing=False)).breakdown
    fused = memory.estimate(spec, s.but(in_backward=True))
    assert max(fused.moments, key=fused.moments.get) == "end"
    assert (fused.breakdown["gradients"], fused.breakdown["tied_gradients"]) == (one, extra)
    assert "tied_gradients" not in memory.estimate(spec, s.but(in_backward=True, micro_batch=8,
                                                               checkpointing=False)).breakdown
    assert optimizer_memory.tied_gradient_bytes(spec, s.but(method="lora")) == 0


def test_the_fused_steps_peak_is_the_largest_of_its_moments():
    """Issue 46: the fused step's transients are those of its largest moment (``in_backward_memory.fused_step_moments``), not
    the sum of every moment's: at 8 × 2048 tokens with checkpointing Llama-3.2-3B peaks in the last layer's backward,
    which holds the recompute and the gradients in flight but not the loss's working memory, the head's saved tensors
    or the end of backward's gradients; the separate step still sums the loss with the recompute."""
    from trainer.models.spec import load_model_spec
    from trainer.planning import memory

    spec = load_model_spec("llama-3.2-3b")
    s = TrainSetup(micro_batch=8, seq_len=2048, in_backward=True, loss_kernel=loss_kernel.CHUNKED, checkpointing=True)
    est = memory.estimate(spec, s)
    assert set(est.moments) == {"loss", "layer", "end"} and max(est.moments, key=est.moments.get) == "layer"
    transients = sum(v for k, v in est.breakdown.items() if k in memory.FUSED_TRANSIENTS)
    assert transients == est.moments["layer"] > est.moments["loss"] > est.moments["end"]
    assert "logits_loss" not in est.breakdown and "tied_gradients" not in est.breakdown
    assert est.breakdown["layer_backward"] == in_backward_memory.layer_backward_bytes(spec, s) > 0
    assert est.breakdown["gradients"] == 2 * spec.vocab * spec.hidden  # the tied head's, buffered by the engine
    separate = memory.estimate(spec, s.but(in_backward=False))
    assert not separate.moments and separate.breakdown["logits_loss"] and separate.breakdown["recompute"]
