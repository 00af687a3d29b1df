"""Mixture-of-experts and multimodal checkpoints in the worker (trainer/worker/loading/model_parts.py).

LoRA on Qwen3-MoE / gpt-oss adapts attention and dense layers and leaves the fused expert weights frozen
(saying so once), or adapts them too with ``method.lora_experts`` (PEFT's ``target_parameters``, no dropout);
multimodal checkpoints (Gemma 3's ``Gemma3ForConditionalGeneration``) train their text model with the towers
frozen, and what the run writes loads with the original class and processor. In-process tests use tiny
in-memory models; the slow ones train the real families (tests/real_models.py) through ``trainpilot-cli``.
"""
from __future__ import annotations

import json

import pytest

from trainer import config as config_mod
from trainer.core.errors import UserError

BASE = {"model": {"source": "x"}, "data": {"path": "x.jsonl"}}


# gpt-oss runs eager attention (transformers has no SDPA path for its attention sinks): the run says so
EAGER = {"qwen3_moe": set(), "gpt_oss": {"eager_attention"}}


def run_config(**method):
    """A RunConfig with a LoRA ``method`` (and any other method fields); the adapters' dropout resolved as the planner
    resolves ``auto`` for a short run (the worker reads resolved configs only)."""
    from trainer.planning.kernels import dropout_default

    cfg = config_mod.validate({**BASE, "method": {"type": "lora", **method}})
    return config_mod.replace(cfg, **{"method.lora_dropout": dropout_default(cfg)})


def tiny(kind: str, **extra):
    """A tiny random model of ``kind`` (qwen3_moe, gpt_oss, gemma3), hidden 64, two layers, 4 experts."""
    import torch
    import transformers

    torch.manual_seed(0)
    text = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                head_dim=16)
    if kind == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(**text, intermediate_size=128, moe_intermediate_size=48, num_experts=4,
                                          num_experts_per_tok=2, **extra)
        return transformers.Qwen3MoeForCausalLM(cfg)
    if kind == "gpt_oss":
        cfg = transformers.GptOssConfig(**text, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2,
                                        sliding_window=16, **extra)
        return transformers.GptOssForCausalLM(cfg)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    cfg = transformers.Gemma3Config(text_config={**text, "intermediate_size": 128, "query_pre_attn_scalar": 16},
                                    vision_config=vision, mm_tokens_per_image=1, image_token_index=511,
                                    boi_token_index=509, eoi_token_index=510)
    return transformers.Gemma3ForConditionalGeneration(cfg)


def adapted(kind: str, **method):
    """``tiny(kind)`` wrapped in PEFT as the worker wraps it (``modeling.lora_config``)."""
    from peft import get_peft_model

    from trainer.worker.loading import modeling

    model = tiny(kind)
    return get_peft_model(model, modeling.lora_config(run_config(**method), model))


def wrappers(model) -> set[str]:
    """Names of the modules PEFT adapts a parameter of (``lora.ParamWrapper``), without PEFT's prefix."""
    return {n.removeprefix("base_model.model.") for n, m in model.named_modules() if type(m).__name__ == "ParamWrapper"}


def test_peft_alone_turns_all_linear_on_qwen3_moe_into_expert_and_router_parameters():
    """Why the default failed: PEFT 0.21's v4->v5 MoE conversion maps all-linear's v4 names (gate_proj, up_proj,
    down_proj, gate) to Qwen3-MoE's fused experts and router, as target_parameters (lora.ParamWrapper, no dropout)."""
    from peft import LoraConfig, get_peft_model

    with pytest.raises(ValueError, match="ParamWrapper does not work with lora_dropout"):
        get_peft_model(tiny("qwen3_moe"), LoraConfig(target_modules="all-linear", lora_dropout=0.05))
    model = get_peft_model(tiny("qwen3_moe"), LoraConfig(target_modules="all-linear", lora_dropout=0.0))
    assert model.peft_config["default"].target_parameters == {"gate_up_proj", "down_proj", "gate.weight"}


@pytest.mark.parametrize("kind", ["qwen3_moe", "gpt_oss"])
def test_default_lora_adapts_attention_and_leaves_experts_and_router_frozen(kind):
    from trainer.worker.loading import model_parts

    model = adapted(kind)  # lora_dropout 0.05, the default
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(".self_attn." in n and ".lora_" in n for n in trained)
    assert not wrappers(model)
    warned = dict(model_parts.part_warnings(run_config(), model))
    assert set(warned) == {"experts_not_adapted"} | EAGER[kind]
    assert warned["experts_not_adapted"].startswith("LoRA adapts attention and dense layers; the experts' weights "
                                                    "(8 experts: 4 per layer in 2 layers, ")
    assert "set method.lora_experts: true with method.lora_dropout: 0" in warned["experts_not_adapted"]


@pytest.mark.parametrize("kind", ["qwen3_moe", "gpt_oss"])
def test_lora_experts_adapts_the_fused_expert_weights_and_they_learn(kind):
    import torch

    from trainer.worker.loading import model_parts

    model = adapted(kind, lora_experts=True, lora_dropout=0.0)
    assert wrappers(model) == {f"model.layers.{i}.mlp.experts{inner}" for i in (0, 1) for inner in ("", ".base_layer")}
    assert set(model.peft_config["default"].target_parameters) == {
        f"model.layers.{i}.mlp.experts.{p}" for i in (0, 1) for p in ("gate_up_proj", "down_proj")}
    assert not any("router" in n or ".gate." in n for n, p in model.named_parameters() if p.requires_grad)
    assert {c for c, _ in model_parts.part_warnings(run_config(lora_experts=True, lora_dropout=0.0), model)} == \
        EAGER[kind]
    experts_b = {n: p for n, p in model.named_parameters() if ".experts." in n and "lora_B" in n}
    assert len(experts_b) == 4 and all(not p.any() for p in experts_b.values())  # LoRA B starts at zero
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(0, 512, (2, 12))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    assert all(p.any() for p in experts_b.values()), "every expert adapter learned"


def test_dense_layers_named_like_v4_experts_are_left_out_and_said_so():
    """Qwen3-MoE with a dense layer (mlp_only_layers): PEFT would map its gate_proj/up_proj/down_proj to the
    experts (now and whenever the adapter is loaded), so they are not targeted, and the run says so."""
    from peft import get_peft_model

    from trainer.worker.loading import model_parts, modeling

    model = tiny("qwen3_moe", mlp_only_layers=[0])
    cfg = run_config()
    model = get_peft_model(model, modeling.lora_config(cfg, model))
    assert not wrappers(model)
    warned = dict(model_parts.part_warnings(cfg, model))
    assert "model.layers.0.mlp.down_proj" in warned["layers_not_adapted"] and "experts_not_adapted" in warned


def test_lora_experts_on_a_model_without_experts_is_refused():
    from trainer.worker.loading import model_parts

    model = tiny("gemma3")
    with pytest.raises(UserError, match="method.lora_experts: this model has no fused expert weights") as info:
        model_parts.lora_targets(run_config(lora_experts=True, lora_dropout=0.0).method, model)
    assert info.value.field == "method.lora_experts"


def test_lora_experts_with_dropout_is_refused_with_the_fix():
    with pytest.raises(config_mod.ConfigError) as info:
        run_config(lora_experts=True, lora_dropout=0.1)
    problems = dict(info.value.problems)
    assert "method.lora_dropout is 0.1; set method.lora_dropout: 0" in problems["method.lora_experts"]
    run_config(lora_experts=True, lora_dropout=0.0)
    config_mod.validate({**BASE, "method": {"type": "full", "lora_experts": True}})  # nothing to adapt: not refused


def model_folder(path, conf: dict):
    """A model folder preflight accepts as one: ``conf`` as config.json, an empty safetensors file, a tokenizer."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps(conf), encoding="utf-8")
    (path / "model.safetensors").write_bytes((2).to_bytes(8, "little") + b"{}")
    (path / "tokenizer.json").write_text("{}", encoding="utf-8")
    return path


def test_preflight_refuses_lora_experts_for_a_model_that_declares_no_experts(tmp_path):
    from trainer.supervisor import preflight

    model_folder(tmp_path / "dense", {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]})
    model_folder(tmp_path / "moe", {"model_type": "qwen3_moe", "num_experts": 128})
    cfg = config_mod.validate({**BASE, "model": {"source": str(tmp_path / "dense")},
                               "method": {"type": "lora", "lora_experts": True, "lora_dropout": 0}})
    with pytest.raises(config_mod.ConfigError) as info:
        preflight.check(cfg)
    assert "is not a mixture of experts" in dict(info.value.problems)["method.lora_experts"]
    moe = config_mod.replace(cfg, **{"model.source": str(tmp_path / "moe")})
    with pytest.raises(config_mod.ConfigError) as info:  # other problems (no data), not this one
        preflight.check(moe)
    assert "method.lora_experts" not in dict(info.value.problems)


def test_multimodal_checkpoint_freezes_towers_and_adapts_only_its_text_model():
    from trainer.worker.loading import model_parts

    model = tiny("gemma3")
    assert model_parts.tower_prefixes(model) == ["model.vision_tower", "model.multi_modal_projector"]
    frozen = model_parts.freeze_towers(model)
    tower = sum(p.numel() for n, p in model.named_parameters() if not n.startswith(("model.language_model", "lm_head")))
    assert frozen == tower > 0
    assert all(p.requires_grad == n.startswith("model.language_model") for n, p in model.named_parameters())
    targets, params = model_parts.lora_targets(run_config(target_modules=["q_proj", "v_proj"]).method, model)
    assert params == [] and len(targets) == 4 and all(t.startswith("model.language_model.") for t in targets)
    with pytest.raises(UserError, match="fc1 not in this model"):  # a vision-tower layer is no target
        model_parts.lora_targets(run_config(target_modules=["fc1"]).method, model)
    assert model_parts.fused_experts(model) == []


def test_the_model_class_of_each_checkpoint():
    import transformers

    from trainer.worker.loading import model_parts

    want = {"Gemma3Config": "AutoModelForImageTextToText", "Mistral3Config": "AutoModelForImageTextToText",
            "Qwen3_5Config": "AutoModelForImageTextToText", "Qwen3_5TextConfig": "AutoModelForCausalLM",
            "Gemma3TextConfig": "AutoModelForCausalLM", "Qwen3MoeConfig": "AutoModelForCausalLM"}
    got = {name: model_parts.auto_class(getattr(transformers, name)()).__name__ for name in want}
    assert got == want


# -- through the CLI, on the real families -------------------------------------------------------------------

RECORDS = [{"messages": [{"role": "user", "content": f"What is {i}+{i}?"},
                         {"role": "assistant", "content": f"It is {2 * i}."}]} for i in range(8)]


def train(tmp_path, family: str, speed: dict | None = None, **method):
    """``trainpilot-cli run`` on ``family`` (tests/real_models.py) with a LoRA/full ``method`` (and ``speed``
    settings): 2 steps."""
    import real_models as rm
    from helpers_train import cli, tiny_config, write_config

    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS), encoding="utf-8")
    cfg = tiny_config(model={"source": str(rm.family_dir(family))}, method={"type": "lora", **method},
                      data={"path": str(data), "seq_len": 128, "packing": True},
                      training={"max_steps": 2, "effective_batch_size": 2, "micro_batch_size": 2,
                                "gradient_accumulation_steps": 1, "learning_rate": 1e-2},
                      checkpoints={"every_steps": 100, "keep_last": 1}, speed=speed or {})
    run_dir = tmp_path / "run"
    env = {"TRAINPILOT_CACHE": str(tmp_path / "cache"), "HF_DATASETS_CACHE": str(tmp_path / "hf-datasets")}
    return cli("run", write_config(tmp_path / "config.yaml", cfg), "--run-dir", run_dir, env=env), run_dir


def export(run_dir, to, *args):
    from helpers_train import cli

    proc = cli("export-model", run_dir, "--to", to, "--merge", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return to


def tensors(path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


@pytest.mark.slow
def test_cli_lora_on_qwen3_moe_trains_says_the_experts_stay_frozen_and_the_merged_export_loads(tmp_path):
    import real_models as rm
    import torch
    from helpers_train import events
    from transformers import AutoModelForCausalLM

    proc, run_dir = train(tmp_path, "qwen3-moe")  # lora_dropout 0.05: the default
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [e["step"] for e in events(run_dir, "step")] == [1, 2]
    warned = [e for e in events(run_dir, "warning") if e["code"] == "experts_not_adapted"]
    assert len(warned) == 1 and "(16 experts: 8 per layer in 2 layers, " in warned[0]["message"]
    assert (run_dir / "train.log").read_text(encoding="utf-8").count(warned[0]["message"]) == 1
    adapter = tensors(run_dir / "final" / "adapter_model.safetensors")
    assert adapter and all(".self_attn." in k for k in adapter)
    merged, info = AutoModelForCausalLM.from_pretrained(export(run_dir, tmp_path / "out"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    base = AutoModelForCausalLM.from_pretrained(rm.family_dir("qwen3-moe"))
    for name in ("model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj",
                 "model.layers.1.mlp.gate.weight"):
        assert torch.equal(merged.get_parameter(name), base.get_parameter(name)), f"{name} changed"
    assert not torch.equal(merged.get_parameter("model.layers.1.self_attn.q_proj.weight"),
                           base.get_parameter("model.layers.1.self_attn.q_proj.weight"))


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3-moe", "gpt-oss"])
def test_cli_lora_experts_trains_the_experts_and_the_merged_export_loads(family):
    """Both expert layouts (Qwen3-MoE's, saved back per expert as on the hub; gpt-oss's fused and transposed), on the
    family's shared run and export (helpers_family: LoRA with method.lora_experts); test_family_training checks the
    same export's GGUF in llama.cpp against transformers."""
    import real_models as rm
    import torch
    from helpers_family import family_export, family_run
    from helpers_train import events
    from transformers import AutoModelForCausalLM

    run_dir = family_run(family)
    assert not [e for e in events(run_dir, "warning") if e["code"] == "experts_not_adapted"]
    adapter = tensors(run_dir / "final" / "adapter_model.safetensors")
    experts_b = {k: v for k, v in adapter.items() if ".mlp.experts." in k and "lora_B" in k}
    assert len(experts_b) == 4 and all(v.abs().sum() > 0 for v in experts_b.values()), "the expert adapters learned"
    merged, info = AutoModelForCausalLM.from_pretrained(family_export(family), output_loading_info=True,
                                                        dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    base = AutoModelForCausalLM.from_pretrained(rm.family_dir(family))
    for name in ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj"):
        assert not torch.equal(merged.get_parameter(name), base.get_parameter(name)), f"{name} not merged"


@pytest.mark.slow
def test_cli_refuses_lora_experts_with_adapter_dropout_before_writing_anything(tmp_path):
    proc, run_dir = train(tmp_path, "qwen3-moe", lora_experts=True, lora_dropout=0.05)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "method.lora_experts" in proc.stderr and "set method.lora_dropout: 0" in proc.stderr
    assert not run_dir.exists()


@pytest.mark.slow
@pytest.mark.parametrize("method", ["lora", "full"])
def test_cli_gemma_3_multimodal_trains_on_text_towers_frozen_and_its_processor_loads_the_result(tmp_path, method):
    """LoRA (the family's shared run and export, helpers_family): only the text model adapted; the merged export
    (towers as they were, processor files) loads with the original class and processor, and chat answers
    (test_family_training runs the same export's text GGUF in llama.cpp). Full: the optimizer holds the text model
    only, final/ loads the same way."""
    import numpy as np
    import real_models as rm
    import torch
    from helpers_family import family_export, family_run
    from helpers_train import cli
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    if method == "lora":
        run_dir = family_run("gemma-3")
    else:
        proc, run_dir = train(tmp_path, "gemma-3", type=method)
        assert proc.returncode == 0, proc.stderr[-3000:]
    final = run_dir / "final"
    assert (final / "processor_config.json").is_file(), "the run's processor (transformers 5 nests the image settings)"
    assert type(AutoProcessor.from_pretrained(final)).__name__ == "Gemma3Processor"
    if method == "lora":
        adapter = tensors(final / "adapter_model.safetensors")
        assert adapter and all(".language_model." in k for k in adapter), "only the text model is adapted"
        assert (final / "tokenizer.model").is_file(), "the SentencePiece model llama.cpp's converter reads"
        out = family_export("gemma-3")  # merged, with the text model's GGUF
        answer = cli("chat", run_dir, "--prompt", "What is 2+2?", "--json", "--max-new-tokens", "4")
        assert answer.returncode == 0 and "text" in json.loads(answer.stdout.splitlines()[-1]), answer.stderr[-2000:]
    else:
        state = torch.load(run_dir / "checkpoints" / "checkpoint-2" / "optimizer.pt", weights_only=False)["state"]
        model = AutoModelForImageTextToText.from_pretrained(rm.family_dir("gemma-3"))
        text = sum(p.numel() for n, p in model.named_parameters() if n.startswith("model.language_model"))
        assert sum(s["exp_avg"].numel() for s in state.values()) == text, "optimizer states for the text model only"
        out = final
    merged, info = AutoModelForImageTextToText.from_pretrained(out, output_loading_info=True)
    assert type(merged).__name__ == "Gemma3ForConditionalGeneration"
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    source = AutoModelForImageTextToText.from_pretrained(rm.family_dir("gemma-3")).state_dict()
    now = merged.state_dict()
    towers = [k for k in source if k.startswith(("model.vision_tower.", "model.multi_modal_projector."))]
    assert towers and all(torch.equal(source[k], now[k]) for k in towers), "the towers are kept as they were"
    assert not torch.equal(source["model.language_model.layers.0.self_attn.q_proj.weight"],
                           now["model.language_model.layers.0.self_attn.q_proj.weight"])
    processor = AutoProcessor.from_pretrained(out)
    image = Image.fromarray((np.random.default_rng(0).random((40, 40, 3)) * 255).astype("uint8"))
    inputs = processor(text=["<start_of_image> What is this?"], images=[[image]], return_tensors="pt")
    with torch.no_grad():
        assert merged(**inputs).logits.shape[-1] == 262208


def test_preflight_reads_a_multimodal_checkpoints_positions_from_its_text_config(tmp_path):
    from trainer.supervisor import preflight

    folder = model_folder(tmp_path / "gemma-3", {"model_type": "gemma3", "vision_config": {},
                                                 "text_config": {"max_position_embeddings": 64}})
    cfg = config_mod.validate({**BASE, "model": {"source": str(folder)}, "data": {"path": "x.jsonl", "seq_len": 128}})
    with pytest.raises(config_mod.ConfigError) as info:
        preflight.check(cfg)
    assert "longer than the model's maximum of 64 positions" in dict(info.value.problems)["data.seq_len"]


@pytest.mark.slow
def test_cli_tiled_mlp_on_gpt_oss_is_bad_input_naming_the_field(tmp_path):
    """gpt-oss's MLP returns its router's scores beside its output: the tiled MLP refuses it before training
    (exit 2, one message naming speed.tiled_mlp, no traceback), never a silent untiled run."""
    proc, run_dir = train(tmp_path, "gpt-oss", speed={"tiled_mlp": True})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "speed.tiled_mlp" in proc.stderr and "router's scores" in proc.stderr and "Traceback" not in proc.stderr
