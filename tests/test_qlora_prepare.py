"""QLoRA's 4-bit base as the worker builds and prepares it, on the CPU (bitsandbytes 0.50.2 has a CPU backend):
embedding, lm_head and norms stay 16-bit (peft's preparation casts them to fp32), the planned weight bytes equal
the prepared model's own (4-bit weights, their quantisation state, the 16-bit rest), the loss is the one peft's
preparation gives, and the random-weight 4-bit builder (``model.architecture``) gives the same bytes."""
from __future__ import annotations

import json

import pytest

from trainer import config as config_mod
from trainer.models.spec import find_config, spec_from_config
from trainer.planning import saver_memory
from trainer.planning.memory import TrainSetup, estimate
from trainer.worker.probes.memory_probe import saved_storages

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
bnb = pytest.importorskip("bitsandbytes")
peft = pytest.importorskip("peft")
pytestmark = pytest.mark.slow  # loads 4-bit models: seconds each

from trainer.worker.loading import kbit, modeling  # noqa: E402  (imports torch)

# An untied Llama (as Llama-3.1-8B: embedding and lm_head apart) and a tied Qwen2 (biases on q/k/v), shrunk.
SHAPES = {
    "llama-3.1-8b": dict(hidden_size=256, intermediate_size=704, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=64, vocab_size=4096),
    "qwen2.5-0.5b": dict(hidden_size=128, intermediate_size=320, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, vocab_size=3000),
}


def _arch(name: str) -> dict:
    d = {k: v for k, v in json.loads(find_config(name).read_text()).items() if not k.startswith("_")}
    return {**d, **SHAPES[name]}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def checkpoint(request, tmp_path_factory):
    """(architecture dict, folder of a bf16 checkpoint with random weights)."""
    d = _arch(request.param)
    conf = transformers.AutoConfig.for_model(**d)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(conf, dtype=torch.bfloat16)
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    return d, folder


def _load_4bit(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, quantization_config=kbit.quantization_config("bf16"),
                                                              dtype=torch.bfloat16, device_map={"": "cpu"})


def _qlora_cfg(folder, checkpointing=False):
    method = {"type": "qlora", "lora_r": 8, "lora_dropout": 0.05}  # the dropout as a resolved config has it
    return config_mod.validate({"model": {"source": str(folder)}, "method": method,
                                "speed": {"gradient_checkpointing": checkpointing}})


def _prepared(folder):
    """The base as the worker prepares it for QLoRA (``modeling.lora_config``), wrapped by PEFT."""
    model = _load_4bit(folder)
    return peft.get_peft_model(model, modeling.lora_config(_qlora_cfg(folder), model))


def test_prepared_model_keeps_embedding_and_head_16bit(checkpoint):
    _, folder = checkpoint
    model = _prepared(folder)
    base = model.get_base_model()
    assert base.get_input_embeddings().weight.dtype == torch.bfloat16
    assert base.get_output_embeddings().weight.dtype == torch.bfloat16
    fp32 = [n for n, p in model.named_parameters() if p.dtype == torch.float32]
    assert fp32 and all("lora_" in n for n in fp32)  # only the adapters (PEFT's autocast_adapter_dtype)
    assert all(p.requires_grad == ("lora_" in n) for n, p in model.named_parameters())
    assert sum(isinstance(m, bnb.nn.Linear4bit) for m in base.modules()) == 7 * 2


def test_peft_preparation_would_have_cast_them_to_fp32(checkpoint):
    """What this replaces: peft 0.21's prepare_model_for_kbit_training upcasts embedding and head."""
    _, folder = checkpoint
    model = peft.prepare_model_for_kbit_training(_load_4bit(folder), use_gradient_checkpointing=False)
    assert model.get_input_embeddings().weight.dtype == torch.float32


def test_planned_weight_bytes_equal_the_prepared_models(checkpoint):
    d, folder = checkpoint
    spec = spec_from_config(d, name="shrunk")
    held = kbit.quantized_bytes(_prepared(folder))
    assert held["weights"] == saver_memory.qlora_weight_bytes(spec)
    est = estimate(spec, TrainSetup(method="qlora", lora_r=8, lora_targets=("all-linear",), device="cpu"))
    assert est.breakdown["weights"] == held["weights"]
    assert est.breakdown["adapter_states"] == 4 * held["adapters"]  # fp32 weight + grad + two AdamW states


def test_random_4bit_model_holds_what_a_quantized_checkpoint_holds(checkpoint):
    """``model.architecture`` with QLoRA: built 4-bit without the 16-bit model, the same bytes as a loaded one."""
    d, _ = checkpoint
    conf = transformers.AutoConfig.for_model(**d)
    torch.manual_seed(0)
    model = kbit.random_4bit_model(transformers.AutoModelForCausalLM, conf, torch.bfloat16, "cpu",
                                   {"attn_implementation": "sdpa"}, "bf16")
    assert getattr(model, "is_loaded_in_4bit", False) and model.config.quantization_config.load_in_4bit
    assert not any(p.device.type == "meta" for p in model.parameters())
    assert not any(b.device.type == "meta" for b in model.buffers())
    assert kbit.quantized_bytes(model)["weights"] == saver_memory.qlora_weight_bytes(spec_from_config(d, name="x"))
    ids = torch.randint(0, conf.vocab_size, (1, 16))
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    assert torch.isfinite(loss) and abs(loss.item() - torch.log(torch.tensor(float(conf.vocab_size))).item()) < 1.0


def test_loss_equals_peft_preparations_and_activations_are_loras(checkpoint):
    """Under the Trainer's bf16 autocast every Linear computes in bf16 either way: the loss is the same within bf16
    noise. Saved activations: peft's fp32 embedding, head and norms carry an fp32 residual stream; with 16-bit ones
    the 4-bit model saves what the same LoRA model over 16-bit weights saves (the planner plans QLoRA's activations
    as LoRA's, tests/test_memory.py checks those)."""
    _, folder = checkpoint
    vocab = transformers.AutoConfig.from_pretrained(folder).vocab_size
    ids = torch.randint(0, vocab, (2, 96), generator=torch.Generator().manual_seed(1))
    lora = peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules="all-linear")
    plain = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    models = {"ours": _prepared(folder), "lora": peft.get_peft_model(plain, lora),
              "peft": peft.get_peft_model(peft.prepare_model_for_kbit_training(_load_4bit(folder),
                                                                               use_gradient_checkpointing=False), lora)}
    out = {}
    for name, model in models.items():
        model.train()
        torch.manual_seed(2)  # the same dropout masks
        with torch.autocast("cpu", dtype=torch.bfloat16), saved_storages(model) as seen:
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        out[name] = (loss.item(), sum(seen.values()))
    assert abs(out["ours"][0] - out["peft"][0]) <= 2e-3 * abs(out["peft"][0])
    assert out["ours"][1] < out["peft"][1]
    assert abs(out["ours"][1] - out["lora"][1]) <= 0.02 * out["lora"][1]
