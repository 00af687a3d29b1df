"""The planner's costs of preference objectives and encoder-decoder models, against what really happens:
TRL's own DPO loss under saved-tensor hooks (reference model included), the model states after a real
optimizer step, HF's T5 under saved-tensor hooks, and parameter counts from transformers itself."""
from __future__ import annotations

import functools
import json

import pytest
from helpers_pref import pref_config

from trainer import config as config_mod
from trainer.models.spec import find_config, load_model_spec, spec_from_config
from trainer.planning.memory import (
    TrainSetup,
    activation_bytes,
    estimate,
    model_states,
    reference_bytes,
)
from trainer.worker.probes.memory_probe import saved_storages

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("trl")

FLAN = ["flan-t5-small", "flan-t5-base", "flan-t5-large", "flan-t5-xl", "tiny-t5"]


def _arch(name: str, **over) -> dict:
    d = {k: v for k, v in json.loads(find_config(name).read_text()).items() if not k.startswith("_")}
    return {**d, **over}


@pytest.mark.parametrize("name", FLAN)
def test_t5_param_counts_equal_transformers(name):
    d = _arch(name)
    cfg = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
    with torch.device("meta"):
        model = transformers.AutoModelForSeq2SeqLM.from_config(cfg)
    spec = load_model_spec(name)
    assert spec.encoder_decoder and sum(p.numel() for p in model.parameters()) == spec.params
    assert load_model_spec(f"google/{name}").params == spec.params  # hub ids find the shipped file


def test_flan_t5_xl_is_the_3b_model_of_seed_002():
    spec = load_model_spec("flan-t5-xl")
    assert 2.7e9 < spec.params < 2.9e9 and spec.layers == spec.decoder_layers == 24 and spec.hidden == 2048


def _t5_saved(over: dict, dtype, b: int, seq: int) -> int:
    d = _arch("flan-t5-small", **over)
    cfg = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
    torch.manual_seed(0)
    model = transformers.AutoModelForSeq2SeqLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    model.train()
    ids = torch.randint(1, cfg.vocab_size, (b, seq))
    labels = torch.randint(1, cfg.vocab_size, (b, seq))
    with saved_storages(model) as seen:
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels, use_cache=False)
    out.loss.backward()
    return sum(seen.values())


T5_SHAPES = [{"d_model": 256, "d_ff": 512, "num_heads": 4, "d_kv": 32, "num_layers": 2, "num_decoder_layers": 2,
              "vocab_size": 2048},
             {"d_model": 128, "d_ff": 384, "num_heads": 6, "d_kv": 16, "num_layers": 1, "num_decoder_layers": 3,
              "vocab_size": 4096}]


@pytest.mark.parametrize("over", T5_SHAPES, ids=["even-stacks", "deep-decoder"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_t5_activations_within_10pct_of_autograd(over, precision):
    spec = spec_from_config(_arch("flan-t5-small", **over))
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    for b, seq in ((2, 96),):
        got = _t5_saved(over, dtype, b, seq)
        acts = activation_bytes(spec, TrainSetup(micro_batch=b, seq_len=seq, precision=precision,
                                                 weights_16bit=precision != "fp32", device="cpu"))
        assert abs((acts["layers"] + acts["head"]) / got - 1) <= 0.10, (b, seq, got, acts)


# -- DPO through TRL's trainer -----------------------------------------------------------------------
SMALL = {"num_hidden_layers": 2, "vocab_size": 1024}


def _dpo_trainer(tmp_path, method: str, precision: str, **training):
    from trainer.worker.loading import modeling
    from trainer.worker.train import objectives
    from trainer.worker.train.recipe import _checkpoint_meta, _training_arguments

    arch = tmp_path / "arch.json"
    arch.write_text(json.dumps(_arch("smollm-135m", **SMALL)))
    raw = pref_config(tmp_path, "dpo", method, training=dict(micro_batch_size=2, gradient_accumulation_steps=4,
                                                             **training))
    raw["model"] = {"source": "demo-tiny-llama", "architecture": str(arch), "tokenizer": "demo"}
    raw["speed"]["precision"] = precision
    raw["data"]["seq_len"] = 512
    cfg = config_mod.validate(raw)
    make = functools.partial(_training_arguments, cfg, tmp_path / "run", precision, False)
    trainer, _ = objectives.build_trainer(cfg, modeling.load_tokenizer(cfg), precision, False,
                                          make, _checkpoint_meta(cfg))
    return cfg, trainer


def _pairs_batch(trainer, b: int, seq: int, prompt: int = 16) -> dict:
    ex = [{"prompt_ids": list(range(3, 3 + prompt)), "chosen_ids": list(range(100, 100 + seq - prompt)),
           "rejected_ids": list(range(200, 200 + seq - prompt))}] * b
    if trainer.precompute_ref_logps:  # scored before training: the batch carries them
        ex = [dict(e, ref_chosen_logps=-1.0, ref_rejected_logps=-1.0) for e in ex]
    return trainer._prepare_inputs(trainer.data_collator(ex))


def _setup(method: str, precision: str, b: int, seq: int, **kw) -> TrainSetup:
    return TrainSetup(micro_batch=b, seq_len=seq, method=method, precision=precision,
                      weights_16bit=precision != "fp32", lora_r=8, lora_dropout=0.0, device="cpu", objective="dpo", **kw)


@pytest.mark.parametrize("method,precision", [  # the 16-bit cases measured >= 3.5 s on the 2-core machine
    ("full", "fp32"), pytest.param("full", "bf16", marks=pytest.mark.slow),
    pytest.param("lora", "bf16", marks=pytest.mark.slow)])
def test_dpo_activations_within_10pct_of_trl_loss(tmp_path, method, precision):
    from trainer.worker.probes.memory_probe import saved_objective_bytes

    spec = spec_from_config(_arch("smollm-135m", **SMALL))
    _, trainer = _dpo_trainer(tmp_path, method, precision)
    assert (trainer.ref_model is not None) == (method == "full")
    for b, seq in ((2, 96),):
        got = saved_objective_bytes(trainer, _pairs_batch(trainer, b, seq))
        acts = activation_bytes(spec, _setup(method, precision, b, seq))
        assert abs((acts["layers"] + acts["head"]) / got - 1) <= 0.10, (b, seq, got, acts)
        # a pair is two sequences: the same setup as SFT would predict about half
        sft = activation_bytes(spec, TrainSetup(**{**_setup(method, precision, b, seq).__dict__, "objective": "sft"}))
        assert sft["layers"] < 0.6 * acts["layers"]


@pytest.mark.parametrize("method,precompute", [  # full with precomputed references measured >= 3.5 s
    ("full", False), pytest.param("full", True, marks=pytest.mark.slow), ("lora", False)])
def test_dpo_model_states_with_reference_within_10pct(tmp_path, method, precompute):
    from trainer.worker.probes.memory_probe import model_state_bytes

    spec = spec_from_config(_arch("smollm-135m", **SMALL))
    _, trainer = _dpo_trainer(tmp_path, method, "fp32", precompute_ref_log_probs=precompute)
    trainer.create_optimizer()
    loss = trainer.compute_loss(trainer.model, _pairs_batch(trainer, 2, 64))
    loss.backward()
    trainer.optimizer.step()  # AdamW allocates its states on the first step
    got = model_state_bytes(trainer)
    setup = _setup(method, "fp32", 2, 64, precompute_ref=precompute)
    states, _ = model_states(spec, setup)
    ref, _ = reference_bytes(spec, setup)
    assert ref == got["reference"]  # exact: the frozen copy is the weights, once
    assert (ref > 0) == (method == "full" and not precompute)
    measured = got["weights"] + got["gradients"] + got["optimizer_states"] + got["reference"]
    assert abs((sum(states.values()) + ref) / measured - 1) <= 0.10, (got, states, ref)


def test_plan_counts_the_reference_only_for_a_full_fine_tune():
    spec = load_model_spec("llama-3.2-1b")
    base = dict(micro_batch=1, seq_len=1024, objective="dpo")
    full = estimate(spec, TrainSetup(method="full", **base)).breakdown
    lora = estimate(spec, TrainSetup(method="lora", **base)).breakdown
    pre = estimate(spec, TrainSetup(method="full", precompute_ref=True, **base)).breakdown
    sft = estimate(spec, TrainSetup(method="full", micro_batch=1, seq_len=1024)).breakdown
    assert full["reference_model"] == 2 * spec.params
    assert "reference_model" not in lora and "reference_model" not in pre
    assert full["activations"] > 1.9 * sft["activations"] - sft.get("logits_loss", 0)
    assert full["logits_loss"] < sft["logits_loss"]  # TRL scores log-probs in tiles, never the full logits
    kto = estimate(spec, TrainSetup(method="lora", micro_batch=2, seq_len=1024, objective="kto")).breakdown
    assert kto["reference_forward"] > 0


def test_plan_reasons_say_what_the_objective_costs(tmp_path):
    from helpers_train import FIXTURES

    from trainer.hardware.source import open_probe
    from trainer.planning.plan import plan_run

    hw = open_probe(str(FIXTURES / "hardware" / "desktop_24gb.jsonl")).snapshot()
    for method, needle in (("full", "frozen copy"), ("lora", "adapters switched off")):
        raw = {"model": {"source": "meta-llama/Llama-3.2-1B"}, "method": {"type": method},
               "training": {"objective": "dpo"}, "data": {"seq_len": 1024}}
        plan = plan_run(config_mod.validate(raw), hw)
        text = " ".join(plan.reasons)
        assert needle in text and "two sequences" in text, text
    raw = {"model": {"source": "google/flan-t5-xl"}, "method": {"type": "full"},  # the separate optimizer step
           "training": {"optimizer_in_backward": False},
           "data": {"seq_len": 512, "prompt_template": "{q}", "response_template": "{a}"}}
    plan = plan_run(config_mod.validate(raw), hw)
    assert any("cross-attention" in r for r in plan.reasons)
    # 2.78 B parameters fully fine-tuned keep 20.7 GiB of states on a 22.2 GiB budget: no micro-batch fits, the
    # host has too little RAM for DeepSpeed's offload, and LoRA is offered instead
    assert plan.verdict == "does_not_fit" and any(a["fits"] and "LoRA" in a["description"]
                                                  for a in plan.to_dict()["alternatives"])
