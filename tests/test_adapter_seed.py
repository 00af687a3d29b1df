"""A LoRA run's adapters start from ``training.seed``: torch 2.13 seeds its default generator from the OS at process
start, so two runs of one config from a pretrained folder (and the ranks of one run) began from different adapters
(found as a gpt-oss export whose greedy answers changed from run to run)."""
from __future__ import annotations

import pytest

from trainer import config as config_mod

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

from trainer.worker.loading import modeling  # noqa: E402  (imports torch)


def _adapters(seed: int) -> dict:
    conf = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                    num_key_value_heads=1, vocab_size=128)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(conf)
    torch.seed()  # whatever state the process is in when the adapters are made (loading consumes the generator)
    cfg = config_mod.validate({"model": {"source": "demo-tiny-llama"}, "training": {"seed": seed},
                               "method": {"type": "lora", "lora_r": 4, "lora_dropout": 0.0}})
    model = modeling._apply_method(cfg, model)
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_A" in n}


def test_the_adapters_start_from_the_runs_seed():
    first, again, other = _adapters(7), _adapters(7), _adapters(8)
    assert first and all(torch.equal(first[n], again[n]) for n in first)
    assert not all(torch.equal(first[n], other[n]) for n in first)
