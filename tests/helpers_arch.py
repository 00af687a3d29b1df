"""Tiny random-weight versions of the architectures people fine-tune in 2025–26, built from the real configs shipped
in trainer/resources/models/ (hidden 64, four layers, the real config's other values shrunk: heads, K/V heads,
experts, windows, vision towers), plus the fitted families' shapes. Used by tests/test_arch_planning.py and
benchmarks/arch_activations.py.
"""
from __future__ import annotations

import json

from trainer.core.paths import MODELS_DIR

# Text-model overrides common to all: hidden 64, 4 layers, 4 heads of 16 (2 K/V heads), MLP 128, vocabulary 512.
TEXT = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 1024}

# Per architecture: (shipped config, extra text overrides, vision overrides). Layer patterns keep each kind.
NEW = {
    "phi3": ("phi-3-mini", {}, None),
    "smollm3": ("smollm3-3b", {"no_rope_layers": [1, 1, 1, 0]}, None),
    "granite": ("granite-3.3-2b", {}, None),
    "cohere2": ("command-r7b", {"sliding_window": 32, "layer_types": ["sliding_attention"] * 3 + ["full_attention"]},
                None),
    "olmo2": ("olmo-2-13b", {"num_key_value_heads": 4}, None),
    "gemma3_text": ("gemma-3-1b", {"sliding_window": 32, "num_key_value_heads": 1, "query_pre_attn_scalar": 16,
                                   "layer_types": ["sliding_attention"] * 3 + ["full_attention"]}, None),
    "gemma3": ("gemma-3-4b", {"sliding_window": 32, "query_pre_attn_scalar": 16,
                              "layer_types": ["sliding_attention"] * 3 + ["full_attention"]},
               {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_hidden_layers": 1,
                "image_size": 28, "patch_size": 14}),
    "qwen3_5": ("qwen3.5-0.8b", {"linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 4,
                                 "linear_num_value_heads": 4, "mtp_num_hidden_layers": 0,
                                 "layer_types": ["linear_attention"] * 3 + ["full_attention"],
                                 "rope_parameters": {"mrope_interleaved": True, "mrope_section": [1, 1, 0],
                                                     "rope_type": "default", "rope_theta": 10000000,
                                                     "partial_rotary_factor": 0.25}},
                {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
                 "num_position_embeddings": 16}),
    "qwen3_moe": ("qwen3-30b-a3b", {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}, None),
    "gpt_oss": ("gpt-oss-20b", {"num_local_experts": 8, "num_experts_per_tok": 2, "experts_per_token": 2,
                                "intermediate_size": 64, "sliding_window": 32,
                                "layer_types": ["sliding_attention", "full_attention"] * 2}, None),
    "lfm2": ("lfm2-700m", {"block_dim": 64, "conv_dim": 64, "conv_dim_out": 64, "block_ff_dim": 192,
                           "full_attn_idxs": [1, 3], "num_heads": 4}, None),
}
# Today's ten families (the issue's), shrunk the same way; all but Qwen 3 plan with their hand-fitted formulas.
TEN = {
    "llama": ("llama-3.2-1b", {}, None),
    "qwen2": ("qwen2.5-0.5b", {}, None),
    "qwen3": ("qwen3-0.6b", {}, None),
    "mistral": ("mistral-7b", {}, None),
    "gemma2": ("gemma-2-2b", {"query_pre_attn_scalar": 16}, None),
    "stablelm": ("stablelm-2-1.6b", {"num_key_value_heads": 4}, None),
    "phi": ("phi-2", {"num_key_value_heads": 4}, None),
    "gpt2": ("gpt2", {}, None),
}
GPT2 = {"n_embd": 64, "n_layer": 4, "n_head": 4, "n_positions": 1024, "vocab_size": 512}


def shipped(name: str) -> dict:
    """A shipped architecture's config.json values (TrainPilot's own ``_`` notes left out)."""
    d = json.loads((MODELS_DIR / f"{name}.json").read_text(encoding="utf-8"))
    return {k: v for k, v in d.items() if not k.startswith("_")}


def tiny_config(family: str) -> dict:
    """The tiny config.json of ``family`` (a key of NEW or FITTED)."""
    name, extra, vision = {**NEW, **TEN}[family]
    cfg = shipped(name)
    cfg.pop("quantization_config", None)
    text = dict(GPT2 if family == "gpt2" else TEXT, **extra)
    if "text_config" in cfg:
        cfg["text_config"] = {**cfg["text_config"], **text}
        cfg["vision_config"] = {**cfg["vision_config"], **(vision or {})}
        if family == "qwen3_5":
            cfg["vision_config"]["out_hidden_size"] = text["hidden_size"]
    else:
        cfg.update(text)
    if family == "lfm2":
        cfg.pop("layer_types", None)
    for part in (cfg, cfg.get("text_config") or {}):  # special token ids inside the shrunk vocabulary
        part.update({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0})
    return cfg


def lora_config(model, r: int = 8, dropout: float = 0.05, experts: bool = False):
    """The PEFT LoraConfig the worker makes for ``model`` on a LoRA run of rank ``r`` (``modeling.lora_config``:
    the one LoRA target rule, ``planning.adapters.matches`` applied by ``model_parts.lora_targets`` — every text
    Linear, not the fused experts unless ``experts``, never the towers of a multimodal checkpoint)."""
    from trainer import config as config_mod
    from trainer.worker.loading import modeling

    cfg = config_mod.validate({"model": {"source": "x"}, "data": {"path": "x.jsonl"},
                               "method": {"type": "lora", "lora_r": r, "lora_alpha": 2 * r, "lora_dropout": dropout,
                                          "lora_experts": experts}})
    return modeling.lora_config(cfg, model)
