"""The planner reads the model itself: structure records (trainer/models/structure.py) made by the structure probe
(trainer/worker/probes/structure_probe.py) replace the hand-written parameter counters, reproduce their counts
exactly, know MoE experts and multimodal towers, and their measured activation coefficients agree with the fitted
formulas where those hold."""
from __future__ import annotations

import json
import subprocess

import pytest

from trainer.core.paths import MODELS_DIR, STRUCTURES_DIR
from trainer.models import catalog, structure
from trainer.models.spec import FITTED_FAMILIES, find_config, load_model_spec, spec_from_config
from trainer.planning import measured
from trainer.planning.memory import TrainSetup, activation_bytes, lora_params

BEFORE = json.loads((MODELS_DIR.parents[2] / "tests" / "fixtures" / "spec_counts_before_probe.json").read_text())
FIELDS = ("family", "params", "layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab",
          "max_positions", "tied_embeddings", "embedding_params", "layer_params", "lm_head_params", "linear_shapes",
          "decoder_layers", "decoder_layer_params", "decoder_linear_shapes")

# What the model cards / hub pages publish for the 2025–26 catalog (parameters, the precision they state).
PUBLISHED = {  # architecture: (count, ± tolerance)
    "qwen3-0.6b": (0.6e9, 0.05e9), "qwen3-1.7b": (1.7e9, 0.05e9), "qwen3-4b": (4.0e9, 0.05e9),
    "qwen3-8b": (8.2e9, 0.05e9), "qwen3-30b-a3b": (30.5e9, 0.05e9), "gpt-oss-20b": (21e9, 0.5e9),
    "gemma-3-1b": (1.0e9, 0.05e9), "gemma-3-4b": (4.30e9, 0.005e9), "smollm3-3b": (3.08e9, 0.005e9),
    "phi-4-mini": (3.8e9, 0.05e9), "granite-3.3-2b": (2.53e9, 0.005e9), "lfm2-700m": (742e6, 0.5e6),
}


def _fields(spec) -> dict:
    out = {f: getattr(spec, f) for f in FIELDS}
    out["linear_shapes"] = [list(x) for x in out["linear_shapes"]]
    out["decoder_linear_shapes"] = [list(x) for x in out["decoder_linear_shapes"]]
    return out


def test_every_shipped_architecture_has_a_current_record():
    wanted = set()
    for path in MODELS_DIR.glob("*.json"):
        cfg = json.loads(path.read_text())
        key = structure.config_hash(cfg)
        wanted.add(f"{key}.json")
        rec = json.loads((STRUCTURES_DIR / f"{key}.json").read_text()) if (STRUCTURES_DIR / f"{key}.json").exists() \
            else None
        # what the planner accepts without a probe (a vision-language record without its vision part was probed
        # again on every user's machine: 17 s of CPU for Qwen3.5-0.8B the first time the picker judged it)
        assert structure.is_current(rec, cfg), \
            f"{path.stem}: no current structure record; run python tools/make_structures.py"
    assert {p.name for p in STRUCTURES_DIR.glob("*.json")} == wanted  # no stale record


@pytest.mark.parametrize("name", sorted(k for k in BEFORE if not k.startswith("_")))
def test_the_records_reproduce_the_retired_counters_exactly(name):
    expected = {f: BEFORE[name][f] for f in FIELDS}
    assert _fields(load_model_spec(name)) == expected


@pytest.mark.slow  # one structure probe child per shrunk config (structure only: fitted families)
@pytest.mark.parametrize("case", BEFORE["_shrunk"], ids=lambda c: c["architecture"])
def test_shrunk_configs_reproduce_the_retired_counters_exactly(case, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINPILOT_CACHE", str(tmp_path))
    cfg = {k: v for k, v in json.loads(find_config(case["architecture"]).read_text()).items() if not k.startswith("_")}
    spec = spec_from_config({**cfg, **case["overrides"]})
    # unshrunk (tiny-llama as shipped) its record ships with the package; every shrunk config is probed
    assert spec.origin == ("probe" if case["overrides"] else "shipped")
    assert _fields(spec) == {f: case["spec"][f] for f in FIELDS}


def test_a_note_in_the_config_does_not_change_its_hash():
    cfg = json.loads(find_config("llama-3.2-1b").read_text())
    assert structure.config_hash(cfg) == structure.config_hash({**cfg, "_trainpilot": "another note"})
    assert structure.config_hash(cfg) != structure.config_hash({**cfg, "num_hidden_layers": 15})


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_counts_match_published(name):
    count, tolerance = PUBLISHED[name]
    assert abs(load_model_spec(name).params - count) <= tolerance, (name, load_model_spec(name).params)


def test_qwen3_5_text_model_is_its_name_and_the_vision_tower_is_frozen():
    spec = load_model_spec("qwen3.5-0.8b")  # "0.8B" names the language model; the vision tower comes on top
    assert round(spec.trainable_params / 1e9, 1) == 0.8 and spec.frozen_params == 100_592_896
    assert {g.type: g.count for g in spec.groups} == {"linear_attention": 18, "full_attention": 6}
    assert spec.attention_layers == 6 and spec.kernels == ("fla", "causal_conv1d")


def test_moe_records_know_their_experts():
    qwen = load_model_spec("qwen3-30b-a3b")
    assert (qwen.experts["total"], qwen.experts["active"], qwen.experts["shared"]) == (128, 8, 0)
    g = qwen.groups[0]
    assert g.count == 48 and dict(g.experts) == {"mlp.experts.gate_up_proj": (128, 1536, 2048),
                                                  "mlp.experts.down_proj": (128, 2048, 768)}
    experts = 48 * sum(e * a * b for _, (e, a, b) in g.experts)
    active = qwen.params - experts + experts * 8 // 128
    assert 3.3e9 <= active < 3.4e9  # the card: "3.3B activated" (3.35B: it truncates)
    assert qwen.intermediate == 8 * 768  # the MLP width one token goes through
    oss = load_model_spec("gpt-oss-20b")
    assert (oss.experts["total"], oss.experts["active"]) == (32, 4) and not oss.supports_sdpa
    assert {g.type for g in oss.groups} == {"sliding_attention", "full_attention"}
    assert next(g.window for g in oss.groups if g.type == "sliding_attention") == 128


def test_lora_on_moe_adapts_experts_only_when_asked():
    spec = load_model_spec("qwen3-30b-a3b")
    plain = lora_params(spec, TrainSetup(method="lora", lora_r=16))
    assert plain == 48 * 16 * ((2048 + 4096) + 2 * (2048 + 512) + (4096 + 2048))  # q, k, v, o: no router, no experts
    experts = lora_params(spec, TrainSetup(method="lora", lora_r=16, lora_experts=True))
    # PEFT's lora.ParamWrapper: lora_A in × r·E, lora_B r·E × out per 3-D expert parameter
    assert experts - plain == 48 * 16 * 128 * ((1536 + 2048) + (2048 + 768))


def test_multimodal_full_finetune_keeps_the_towers_frozen():
    spec = load_model_spec("gemma-3-4b")
    assert [t for t in json.loads((STRUCTURES_DIR / f"{structure.config_hash(json.loads(find_config('gemma-3-4b').read_text()))}.json").read_text())["towers"]] == \
        [{"name": "model.vision_tower", "params": 416_866_032}, {"name": "model.multi_modal_projector", "params": 2_950_272}]
    from trainer.planning.memory import model_states
    states, _ = model_states(spec, TrainSetup())
    trainable = spec.params - 419_816_304
    assert states == {"weights": 2 * trainable, "gradients": 2 * trainable, "optimizer_states": 4 * trainable,
                      "frozen_weights": 2 * 419_816_304}


def test_catalog_lists_the_2025_26_models():
    popular = dict(catalog.popular())
    for repo in ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-8B", "Qwen/Qwen3.5-0.8B", "google/gemma-3-1b-pt", "google/gemma-3-4b-it",
                 "meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-3B", "HuggingFaceTB/SmolLM3-3B",
                 "microsoft/Phi-4-mini-instruct", "ibm-granite/granite-3.3-2b-instruct", "openai/gpt-oss-20b",
                 "Qwen/Qwen3-30B-A3B"):
        assert repo in popular and load_model_spec(repo).params > 0
    for arch in catalog.HUB_IDS:  # every shipped real model says where its values came from
        assert "config.json" in json.loads(find_config(arch).read_text())["_trainpilot"], arch


# -- measured coefficients vs the fitted formulas -----------------------------------------------------------------
SETUPS = {"bf16": {}, "lora": {"method": "lora"}, "amp": {"weights_16bit": False},
          "fp32": {"precision": "fp32", "weights_16bit": False}, "checkpointing": {"checkpointing": True}}
# GPT-2's formula is the Llama layout, never fitted to GPT-2 (docs/planner.md): fp32 there is 12% under what autograd
# keeps, where the measured coefficients are exact (tests/test_arch_planning.py, benchmarks/arch_activations.py).
KNOWN_GAPS = {("gpt2", "fp32")}


@pytest.mark.parametrize("name", ["smollm-135m", "gpt2", "qwen2.5-0.5b", "llama-3.2-1b", "stablelm-2-1.6b",
                                  "gemma-2-2b", "phi-2", "llama-3.2-3b", "mistral-7b", "qwen2.5-7b", "llama-3.1-8b"])
def test_measured_coefficients_agree_with_the_fitted_formulas(name):
    spec = load_model_spec(name)
    assert spec.fitted and spec.activations
    for label, kw in SETUPS.items():
        s = TrainSetup(micro_batch=2, seq_len=2048, attn="eager" if spec.family == "gemma2" else "sdpa", **kw)
        fitted, meas = activation_bytes(spec, s), measured.activation_bytes(spec, s)
        ratio = (meas["layers"] + meas["head"]) / (fitted["layers"] + fitted["head"])
        assert (name, label) in KNOWN_GAPS or abs(ratio - 1) <= 0.10, (name, label, ratio)


def test_qwen3_plans_with_its_measured_coefficients():
    """Qwen 3 used to share Llama's formula; its q/k norms and 2×hidden attention width make that 27-32% low."""
    spec = load_model_spec("qwen3-0.6b")
    assert "qwen3" not in FITTED_FAMILIES and not spec.fitted
    s = TrainSetup(micro_batch=1, seq_len=2048)
    assert activation_bytes(spec, s) == measured.activation_bytes(spec, s)


@pytest.mark.slow  # measured >= 3.5 s on the 2-core machine
def test_an_architecture_transformers_cannot_build_is_unknown_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINPILOT_CACHE", str(tmp_path))
    cfg = {"model_type": "not-a-real-architecture", "hidden_size": 8}
    with pytest.raises(structure.ArchitectureUnknown, match="not known to the memory estimator") as info:
        spec_from_config(cfg)
    assert "cannot build" in str(info.value) and "upgrade transformers" in str(info.value)
    assert "set training values" in str(info.value)

    def no_child(*a, **k):
        raise AssertionError("a refusal is cached: no second probe child")

    monkeypatch.setattr(subprocess, "run", no_child)
    with pytest.raises(structure.ArchitectureUnknown, match="not known"):
        spec_from_config(cfg)


def test_a_cached_record_needs_no_child(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINPILOT_CACHE", str(tmp_path))
    cfg = json.loads(find_config("qwen3-0.6b").read_text())
    rec, origin = structure.cached_record(cfg)
    assert origin == "shipped"
    other = {**cfg, "num_hidden_layers": 2}
    (tmp_path / "structures").mkdir()
    (tmp_path / "structures" / f"{structure.config_hash(other)}.json").write_text(json.dumps(rec))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(AssertionError("no child")))
    assert spec_from_config(other).origin == "cache"
