"""Issue 46 item 5: ``plan --measure`` (trainer/worker/probes/memory_probe.py) measures the optimizer the run trains
with, built by HF's own ``Trainer.create_optimizer``: its two groups, bitsandbytes' class for the 8-bit placements
with every ``nn.Embedding`` registered for 32-bit states under the separate step, and the worker's ``InBackwardStep`` over
it when the step is fused (the overrides dropped: 8-bit throughout). Built on the CPU (no step is taken)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trainer.core import capabilities  # noqa: E402
from trainer.worker.probes.memory_probe import optimizer_as_trained  # noqa: E402

TINY = dict(model_type="llama", vocab_size=5000, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False)


def cfg(optimizer: str, fused: bool = False):
    return SimpleNamespace(training=SimpleNamespace(optimizer=optimizer, learning_rate=1e-4, weight_decay=0.01,
                                                    optimizer_in_backward=fused),
                           speed=SimpleNamespace(fused_adamw=True))


def model():
    conf = transformers.AutoConfig.for_model(**TINY)
    return transformers.AutoModelForCausalLM.from_config(conf)


@pytest.mark.slow  # transformers' Trainer imported: ~10 s on 2 cores
def test_pytorchs_adamw_in_hfs_two_groups():
    m = model()
    opt = optimizer_as_trained(cfg("adamw"), m, use_cuda=False)
    assert type(opt) is torch.optim.AdamW
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0]
    norms = {id(p) for n, p in m.named_parameters() if "norm" in n}
    assert norms and norms <= {id(p) for p in opt.param_groups[1]["params"]}  # HF's no-decay group


@pytest.mark.slow
@pytest.mark.skipif(not capabilities.installed("bitsandbytes"), reason="8-bit AdamW is bitsandbytes'")
def test_8bit_adamw_keeps_the_embeddings_states_32bit_under_the_separate_step_only():
    import bitsandbytes as bnb

    manager = bnb.optim.GlobalOptimManager.get_instance()
    m = model()
    embedding = m.get_input_embeddings()
    opt = optimizer_as_trained(cfg("adamw_8bit"), m, use_cuda=False)
    assert type(opt).__module__.startswith("bitsandbytes") and opt.args.optim_bits == 8
    overridden = [t for t in manager.module_weight_config_triple if getattr(t[0], t[1]) is embedding.weight]
    assert overridden and overridden[0][2] == {"optim_bits": 32}

    m = model()
    fused = optimizer_as_trained(cfg("paged_adamw_8bit", fused=True), m, use_cuda=False)
    from trainer.worker.loading.in_backward_step import InBackwardStep

    assert isinstance(fused, InBackwardStep) and type(fused.layout).__module__.startswith("bitsandbytes")
    assert fused.layout.args.optim_bits == 8 and fused.layout.is_paged
    assert not [t for t in manager.module_weight_config_triple
                if getattr(t[0], t[1]) is m.get_input_embeddings().weight]
