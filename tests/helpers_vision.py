"""Tiny random-weight vision-language models (SmolVLM/Idefics3-, LLaVA-, Qwen2.5-VL-, Qwen3-VL- and Gemma 3-shaped: a
text model of hidden 64 and a vision tower of two (Qwen3-VL: four, with two deepstack taps) blocks), and one training forward with pictures
measured with autograd: what benchmarks/vision_activations.py and tests/test_vision_planning.py compare the
planner with. Inputs are built as each processor lays them out (image tokens in the text, the pixel tensors of the
family), at a given number of pictures per sample."""
from __future__ import annotations

TEXT = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 4096, "bos_token_id": 1,
        "eos_token_id": 2, "pad_token_id": 0}
IMAGE = 500  # the image placeholder id in every tiny vocabulary

CONFIGS = {
    # SmolVLM-shaped (Idefics3 class): SigLIP-like tower on 64-px tiles of 16-px patches, pixel shuffle 2 → 4 tokens
    "smolvlm": {"model_type": "idefics3", "image_token_id": IMAGE, "scale_factor": 2, "tie_word_embeddings": False,
                "text_config": {"model_type": "llama", **TEXT},
                "vision_config": {"model_type": "idefics3_vision", "hidden_size": 32, "intermediate_size": 64,
                                  "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": 64,
                                  "patch_size": 16}},
    # LLaVA-shaped: CLIP tower on 32-px pictures of 8-px patches (16 + CLS positions), 16 tokens, layer −2
    "llava": {"model_type": "llava", "image_token_index": IMAGE, "vision_feature_layer": -2,
              "vision_feature_select_strategy": "default", "projector_hidden_act": "gelu",
              "text_config": {"model_type": "llama", **TEXT},
              "vision_config": {"model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                                "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": 32, "patch_size": 8,
                                "projection_dim": 32}},
    # Qwen2.5-VL-shaped: a window-attention ViT of 14-px patches merged 2×2, M-RoPE text model
    "qwen2_5_vl": {"model_type": "qwen2_5_vl", "image_token_id": IMAGE, "video_token_id": 501,
                   "vision_start_token_id": 502, "vision_end_token_id": 503, "tie_word_embeddings": False,
                   "text_config": {"model_type": "qwen2_5_vl_text", **TEXT,
                                   "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}},
                   "vision_config": {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                                     "out_hidden_size": 64, "patch_size": 14, "spatial_merge_size": 2,
                                     "temporal_patch_size": 2, "window_size": 56, "fullatt_block_indexes": [1]}},
    # Qwen3-VL-shaped: 16-px patches merged 2×2, learned position embeddings, two deepstack taps into the text model
    "qwen3_vl": {"model_type": "qwen3_vl", "image_token_id": IMAGE, "video_token_id": 501, "vision_start_token_id": 502,
                 "vision_end_token_id": 503, "tie_word_embeddings": False,
                 "text_config": {"model_type": "qwen3_vl_text", **TEXT,
                                 "rope_parameters": {"rope_type": "default", "rope_theta": 5000000,
                                                     "mrope_section": [2, 3, 3], "mrope_interleaved": True}},
                 "vision_config": {"depth": 4, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                                   "out_hidden_size": 64, "patch_size": 16, "spatial_merge_size": 2,
                                   "temporal_patch_size": 2, "num_position_embeddings": 64,
                                   "deepstack_visual_indexes": [1, 2]}},
    # Gemma 3-shaped: SigLIP on 56-px pictures (16 positions) pooled to 4 tokens; image tokens attend both ways
    "gemma3": {"model_type": "gemma3", "image_token_index": IMAGE, "boi_token_index": 503, "eoi_token_index": 504,
               "mm_tokens_per_image": 4,
               "text_config": {"model_type": "gemma3_text", **TEXT, "sliding_window": 32, "query_pre_attn_scalar": 16,
                               "layer_types": ["sliding_attention"] * 3 + ["full_attention"]},
               "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                                 "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": 56,
                                 "patch_size": 14, "vision_use_head": False}},
}
PROCESSORS = {  # processor files of the tiny models (preprocessor_config.json + processor_config.json, merged)
    "smolvlm": {"size": {"longest_edge": 128}, "max_image_size": {"longest_edge": 64}, "do_image_splitting": True,
                "image_seq_len": 4},
    "llava": {"crop_size": {"height": 32, "width": 32}, "size": {"shortest_edge": 32}, "patch_size": 8,
              "num_additional_image_tokens": 1, "vision_feature_select_strategy": "default"},
}


def tiny_config(name: str) -> dict:
    """The config.json dict of a tiny vision-language model."""
    import copy

    return copy.deepcopy(CONFIGS[name])


def build(cfg: dict, lora: bool = False, train_vision: str = "none", r: int = 8, dropout: float = 0.05):
    """The model in bf16 on the CPU, with what trains set as a run would: LoRA (r, dropout) on every text Linear,
    plus, for ``train_vision`` 'all', on every vision block Linear; the projector fully trained ('projector'/'all');
    a full fine-tune trains the text model and the chosen vision parts."""
    import torch
    import transformers

    from trainer.worker.probes import vision_bytes
    from trainer.worker.probes.structure_probe import model_class, towers

    d = dict(cfg)
    conf = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
    cls = model_class(conf)
    torch.manual_seed(0)
    model = cls._from_config(conf, dtype=torch.bfloat16, attn_implementation="sdpa")
    found = vision_bytes.parts(model, towers(model, model.get_decoder()))
    vision_names = found["tower"] + found["projector"]
    if lora:
        import peft

        text = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not
                model.get_output_embeddings() and not any(n.startswith(v) for v in vision_names)]
        tower = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and train_vision == "all" and
                 any(n.startswith(t) for t in found["tower"]) and not any(n.startswith(p) for p in found["projector"])]
        lcfg = peft.LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=dropout, target_modules=text + tower,
                               modules_to_save=found["projector"] if train_vision != "none" else None)
        return peft.get_peft_model(model, lcfg), found
    for n in vision_names:
        trains = (n in found["projector"] and train_vision != "none") or train_vision == "all"
        for p in model.get_submodule(n).parameters():
            p.requires_grad_(trains)
    return model, found


def geometry(name: str, model, side: int = 4) -> tuple[int, int, int]:
    """(image tokens, vision units, positions per unit) of one picture of the tiny model (Qwen: ``side`` × ``side``
    patches)."""
    cfg = model.config
    vc = cfg.vision_config
    if name == "smolvlm":
        n = (vc.image_size // vc.patch_size) ** 2
        return n // cfg.scale_factor ** 2, 1, n
    if name.startswith("qwen"):
        return side * side // vc.spatial_merge_size ** 2, 1, side * side
    if name == "gemma3":
        return cfg.mm_tokens_per_image, 1, (vc.image_size // vc.patch_size) ** 2
    n = (vc.image_size // vc.patch_size) ** 2
    return n, 1, n + 1  # LLaVA: the CLS position is dropped from the tokens (strategy 'default')


def inputs(name: str, model, batch: int, text: int, pictures: int, side: int = 4) -> tuple[dict, int]:
    """One micro-batch: ``batch`` samples of ``text`` text tokens (at least ``pictures``) and ``pictures`` pictures,
    each picture's image tokens followed by a text token, labels = the ids; and the image tokens per sample."""
    import torch

    cfg = model.config
    vc = cfg.vision_config
    per, _, n = geometry(name, model, side)
    bf16 = torch.bfloat16
    if name == "smolvlm":
        s = vc.image_size
        pix = {"pixel_values": torch.randn(batch, pictures, 3, s, s, dtype=bf16),
               "pixel_attention_mask": torch.ones(batch, pictures, s, s, dtype=torch.bool)}
    elif name.startswith("qwen"):
        pix = {"pixel_values": torch.randn(batch * pictures * n, 3 * 2 * vc.patch_size ** 2, dtype=bf16),
               "image_grid_thw": torch.tensor([[1, side, side]] * (batch * pictures))}
    else:
        pix = {"pixel_values": torch.randn(batch * pictures, 3, vc.image_size, vc.image_size, dtype=bf16)}
    ids = torch.randint(3, 400, (batch, text + pictures * per))
    for k in range(pictures):  # each picture's tokens, then one text token (a picture's tokens are one group)
        ids[:, k * (per + 1): k * (per + 1) + per] = IMAGE
    kinds = (ids == IMAGE).long()
    extra = {"token_type_ids": kinds} if name == "gemma3" else {"mm_token_type_ids": kinds} \
        if name.startswith("qwen") else {}
    return {"input_ids": ids, "labels": ids.clone(), **pix, **extra}, pictures * per


def saved_bytes(model, kwargs: dict, checkpointing: bool = False) -> int:
    """Bytes of the distinct non-parameter storages one training forward (with the loss) saves for backward."""
    from trainer.worker.probes.memory_probe import saved_storages

    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    with saved_storages(model) as seen:
        out = model(**kwargs, use_cache=False)
    out.loss.backward()
    model.zero_grad(set_to_none=True)
    return int(sum(seen.values()))
