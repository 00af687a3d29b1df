"""Tiny random-weight models of popular families with their REAL tokenizers and chat templates.

The llama-cpp-python source distribution (``pip download --no-deps --no-binary :all:
llama-cpp-python==0.3.36``, unpacked by ``installers/linux/dev-setup.sh --dev``) carries llama.cpp's
vocab-only GGUFs (``models/ggml-vocab-*.gguf``, each with ``.inp``/``.out`` tokenizer test vectors)
and real chat templates (``models/templates/*.jinja``). From them this module builds, per family, a
folder a user could have downloaded: ``config.json`` + ``model.safetensors`` (hidden 64, 2 layers,
the family's real vocabulary size), ``tokenizer.json`` (+ ``tokenizer.model`` for SentencePiece
vocabularies), ``tokenizer_config.json`` with the family's special tokens and the real template, and
``generation_config.json`` with the end-of-turn ids. Nothing is downloaded: a missing sdist skips.

Built once, under ``${XDG_CACHE_HOME:-~/.cache}/trainpilot-dev/real-models/<sdist>-f<format>-<builder hash>/<family>/``,
written aside and renamed into place. ``python tests/real_models.py --build [FAMILY...]`` prebuilds the cache.

Where a family's own vocabulary is not among the GGUFs, the closest one is used and said so in
``Family.note`` (Mistral Nemo's Tekken vocabulary -> Llama 2's SentencePiece; Gemma 2's SentencePiece
-> Llama 2's pieces under Gemma's special-token names, no dummy prefix; DeepSeek-R1-Distill-Qwen ->
Qwen2's vocabulary with DeepSeek's special tokens at its reserved ids, as the real one has; Command R7B ->
Command R's vocabulary with R7B's new tokens at reserved ids; Granite 3.3 -> StarCoder's, which Granite's extends;
gpt-oss's o200k_harmony -> Llama 3's with harmony's tokens at its reserved ids; Gemma 3 -> Gemma 4's vocabulary, the
same 262k pieces, with Gemma 3's turn and image tokens).

Mixture-of-experts families (Qwen3-MoE, gpt-oss) are saved as their hub repos store them (transformers fuses
the experts into 3-D parameters when it loads them); a multimodal family (Gemma 3) is the whole
``…ForConditionalGeneration`` checkpoint: a vision tower and projector beside the text model, and the
processor files (``preprocessor_config.json``, ``processor_config.json``).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

SDIST_VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{SDIST_VERSION}"
TEST_SEPARATOR = "\n__ggml_vocab_test__\n"  # llama.cpp's tests/test-tokenizer-0 file format
FORMAT = 4  # bump when what a family folder holds changes (old caches are rebuilt, not reused)


def builder_hash() -> str:
    """Short hash of this builder's source (this file and real_tokenizers.py): part of the cache folder's
    name, so folders built by another version of the builder are never reused."""
    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for name in ("real_models.py", "real_tokenizers.py"):
        h.update((here / name).read_bytes())
    return h.hexdigest()[:10]

QWEN_RESERVED = ["<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
                 "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
                 "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
                 "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]  # ids 151646.. in Qwen2.5
QWEN3_EXTRA = ["<tool_response>", "</tool_response>", "<think>", "</think>"]  # ids 151665.. in Qwen3
# DeepSeek-R1-Distill-Qwen renames Qwen's <|endoftext|> and takes the reserved ids from 151644 on.
DEEPSEEK_RESERVED = ["<｜User｜>", "<｜Assistant｜>", "<｜begin▁of▁sentence｜>", "<|EOT|>", "<think>", "</think>",
                     "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                     "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
                     "<｜tool▁output▁end｜>", "<｜tool▁sep｜>"]
# Command R7B's tokens beyond Command R's vocabulary (its template writes them around thinking, actions and answers).
COMMAND_R7B_TOKENS = ["<|START_THINKING|>", "<|END_THINKING|>", "<|START_ACTION|>", "<|END_ACTION|>",
                      "<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TOOL_RESULT|>", "<|END_TOOL_RESULT|>"]
NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
               "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"}


@dataclass(frozen=True)
class Family:
    """One family: its vocab GGUF, template, architecture and special tokens (as the real model has)."""
    vocab: str                      # ggml-vocab-<vocab>.gguf
    template: str                   # models/templates/<template>.jinja
    arch: str                       # transformers config class name prefix, e.g. "Qwen2"
    bos: str | None
    eos: str                        # tokenizer_config eos_token (the instruct models' end of turn)
    end_of_turn: tuple[str, ...]    # generation_config eos_token_id, as tokens
    add_bos: bool                   # whether the tokenizer itself prepends bos
    pad: str | None = None
    renames: dict = field(default_factory=dict)  # id -> token text (reserved ids given their real names)
    config: dict = field(default_factory=dict)   # extra config.json fields (rope scaling, ...)
    dummy_prefix: bool = True       # SentencePiece: prepend "▁" to the text
    sp_pieces: int | None = None    # SentencePiece: pieces in tokenizer.model (the rest are added tokens)
    renamed_pieces: dict = field(default_factory=dict)  # SentencePiece: id -> piece text
    extra_tokens: tuple[str, ...] = ()  # appended special tokens (Gemma's turn markers)
    vocab_size: int | None = None   # config.json vocab_size when the embedding has unused rows
    vision: dict = field(default_factory=dict)  # a multimodal checkpoint: vision_config + processor (see _build_image_text)
    tokenizer_class: str = "PreTrainedTokenizerFast"  # tokenizer_config.json's, as the hub repo has it
    note: str = ""


def _qwen_renames(names: list[str], start: int = 151646) -> dict:
    return {start + i: n for i, n in enumerate(names)}


LLAMA3_ROPE = {"rope_theta": 500000.0, "max_position_embeddings": 131072,
               "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
LLAMA3_EOT = ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")

# Mixture-of-experts and multimodal families, shrunk from their hub config.json files (Qwen/Qwen3-30B-A3B:
# 128 experts, 8 per token, moe_intermediate_size 768, no shared experts, every layer sparse; openai/gpt-oss-20b:
# 32 local experts, 4 per token, intermediate 2880, sliding window 128 on every other layer, yarn rope ×32 over
# 4096, attention bias and sinks; google/gemma-3-4b-it: Gemma3ForConditionalGeneration, a SigLIP vision tower
# (896 px, patch 14) pooled to 256 tokens per image, linear rope ×8 on global layers (every 6th), sliding window 1024).
# Expert widths differ from hidden/2 so that a transposed expert weight cannot pass unnoticed.
QWEN3_MOE = {"rope_theta": 1000000.0, "tie_word_embeddings": False, "num_experts": 8, "num_experts_per_tok": 2,
             "moe_intermediate_size": 48, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
             "max_position_embeddings": 40960}
GPT_OSS = {"rope_theta": 150000.0, "max_position_embeddings": 131072, "tie_word_embeddings": False,
           "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                            "original_max_position_embeddings": 4096, "truncate": False},
           "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 48, "sliding_window": 128,
           "layer_types": ["sliding_attention", "full_attention"], "attention_bias": True, "swiglu_limit": 7.0,
           "router_aux_loss_coef": 0.9}
# Harmony's special tokens at Llama 3's reserved ids, spaced as gpt-oss spaces them from 199998
HARMONY = {128000: "<|startoftext|>", 128001: "<|endoftext|>", 128004: "<|return|>", 128005: "<|constrain|>",
           128007: "<|channel|>", 128008: "<|start|>", 128009: "<|end|>", 128010: "<|message|>", 128014: "<|call|>"}
GEMMA3_TEXT = {"tie_word_embeddings": True, "query_pre_attn_scalar": 16, "sliding_window": 128,
               # five sliding layers, then a global one: Gemma 3's pattern, which llama.cpp assumes for the arch
               "num_hidden_layers": 6, "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
               "hidden_activation": "gelu_pytorch_tanh",
               "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "rope_theta": 1000000.0,
               "rope_local_base_freq": 10000.0, "max_position_embeddings": 131072}
GEMMA3_VISION = {"vision_config": {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                                   "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 56, "patch_size": 14,
                                   "vision_use_head": False, "layer_norm_eps": 1e-6},
                 "mm_tokens_per_image": 4, "boi_token_index": 255999, "eoi_token_index": 256000,
                 "image_token_index": 262144}


FAMILIES: dict[str, Family] = {
    "qwen2.5": Family("qwen2", "Qwen-Qwen2.5-7B-Instruct", "Qwen2", None, "<|im_end|>", ("<|im_end|>", "<|endoftext|>"),
                      False, pad="<|endoftext|>", renames=_qwen_renames(QWEN_RESERVED),
                      config={"rope_theta": 1000000.0, "tie_word_embeddings": False}),
    "qwen3": Family("qwen2", "Qwen-Qwen3-0.6B", "Qwen3", None, "<|im_end|>", ("<|im_end|>", "<|endoftext|>"), False,
                    pad="<|endoftext|>", renames=_qwen_renames(QWEN_RESERVED + QWEN3_EXTRA),
                    config={"rope_theta": 1000000.0, "tie_word_embeddings": True}),
    "deepseek-r1-distill": Family(
        "qwen2", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "Qwen2", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
        ("<｜end▁of▁sentence｜>",), True, pad="<｜end▁of▁sentence｜>",
        renames={151643: "<｜end▁of▁sentence｜>", **_qwen_renames(DEEPSEEK_RESERVED, 151644)},
        config={"rope_theta": 1000000.0, "tie_word_embeddings": False},
        note="Qwen2 vocabulary with DeepSeek's special tokens at Qwen's reserved ids (151643..)"),
    "llama-3.2": Family("llama-bpe", "meta-llama-Llama-3.2-3B-Instruct", "Llama", "<|begin_of_text|>", "<|eot_id|>",
                        LLAMA3_EOT, True, renames={128008: "<|eom_id|>"},
                        config={**LLAMA3_ROPE, "tie_word_embeddings": True}),
    "llama-3.1": Family("llama-bpe", "meta-llama-Llama-3.1-8B-Instruct", "Llama", "<|begin_of_text|>", "<|eot_id|>",
                        LLAMA3_EOT, True, renames={128008: "<|eom_id|>"},
                        config={**LLAMA3_ROPE, "rope_scaling": {**LLAMA3_ROPE["rope_scaling"], "factor": 8.0},
                                "tie_word_embeddings": False}),
    "mistral-nemo": Family("llama-spm", "mistralai-Mistral-Nemo-Instruct-2407", "Mistral", "<s>", "</s>", ("</s>",),
                           True, config={"rope_theta": 1000000.0, "tie_word_embeddings": False},
                           note="Llama 2's SentencePiece vocabulary (Mistral Nemo's Tekken BPE is not among the GGUFs)"),
    "llama-2": Family("llama-spm", "mistralai-Mistral-Nemo-Instruct-2407", "Llama", "<s>", "</s>", ("</s>",), True,
                      config={"tie_word_embeddings": False, "max_position_embeddings": 4096},
                      tokenizer_class="LlamaTokenizer",
                      note="Llama 2's own SentencePiece vocabulary and tokenizer files (model_type llama, tokenizer_class "
                           "LlamaTokenizer: the Llama 2, TinyLlama, Yi, Vicuna class); Mistral Nemo's [INST] template "
                           "(Llama 2's chat template is not in the sdist)"),
    "phi-3.5": Family("phi-3", "microsoft-Phi-3.5-mini-instruct", "Phi3", "<s>", "<|endoftext|>",
                      ("<|endoftext|>", "<|assistant|>", "<|end|>"), False, pad="<|endoftext|>", sp_pieces=32000,
                      vocab_size=32064, config={"tie_word_embeddings": False}, tokenizer_class="LlamaTokenizer"),
    "gemma-2": Family("llama-spm", "google-gemma-2-2b-it", "Gemma2", "<bos>", "<eos>", ("<eos>", "<end_of_turn>"), True,
                      pad="<pad>", dummy_prefix=False, renamed_pieces={1: "<bos>", 2: "<eos>"},
                      extra_tokens=("<pad>", "<start_of_turn>", "<end_of_turn>"), config={"tie_word_embeddings": True},
                      tokenizer_class="GemmaTokenizer",
                      note="Llama 2's SentencePiece pieces under Gemma's special-token names, no dummy prefix "
                           "(Gemma 2's 256k SentencePiece vocabulary is not among the GGUFs); ids differ from Gemma's"),
    "command-r7b": Family(
        "command-r", "CohereForAI-c4ai-command-r7b-12-2024-tool_use", "Cohere2", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>",
        ("<|END_OF_TURN_TOKEN|>",), True, pad="<PAD>", renames={255029 + i: t for i, t in enumerate(COMMAND_R7B_TOKENS)},
        config={"rope_theta": 50000.0, "logit_scale": 0.25, "sliding_window": 4096, "rotary_pct": 1.0,
                "layer_types": ["sliding_attention", "full_attention"], "max_position_embeddings": 8192,
                "tie_word_embeddings": True},
        note="Command R's 256k BPE vocabulary (ggml-vocab-command-r.gguf, digits split, NFC) with R7B's thinking, action "
             "and response tokens at reserved ids 255029.. (R7B's own vocabulary is not among the GGUFs; those ids "
             "differ from R7B's)"),
    "granite-3.3": Family(
        "starcoder", "ibm-granite-granite-3.3-2B-Instruct", "Granite", "<|end_of_text|>", "<|end_of_text|>",
        ("<|end_of_text|>",), False, pad="<|end_of_text|>", renames={0: "<|end_of_text|>"},
        extra_tokens=("<|start_of_role|>", "<|end_of_role|>", "<|tool_call|>"),
        config={"rope_theta": 10000000.0, "embedding_multiplier": 12.0, "logits_scaling": 8.0,
                "residual_multiplier": 0.22, "attention_multiplier": 0.0625, "max_position_embeddings": 131072,
                "tie_word_embeddings": True},
        note="StarCoder's 49k BPE vocabulary (ggml-vocab-starcoder.gguf), the closest to Granite 3's, which extends it: "
             "<|endoftext|> renamed <|end_of_text|>, Granite's role tokens appended from id 49152 (Granite 3.3's own "
             "vocabulary is not among the GGUFs)"),
    "qwen3-moe": Family("qwen2", "Qwen-Qwen3-0.6B", "Qwen3Moe", None, "<|im_end|>", ("<|im_end|>", "<|endoftext|>"),
                        False, pad="<|endoftext|>", renames=_qwen_renames(QWEN_RESERVED + QWEN3_EXTRA), config=QWEN3_MOE,
                        note="Qwen3's vocabulary and template (Qwen3-30B-A3B ships the same ones)"),
    "gpt-oss": Family("llama-bpe", "openai-gpt-oss-120b", "GptOss", "<|startoftext|>", "<|return|>",
                      ("<|return|>", "<|endoftext|>", "<|call|>"), False, pad="<|endoftext|>", renames=HARMONY,
                      config=GPT_OSS,
                      note="Llama 3's tiktoken-style BPE vocabulary with harmony's special tokens at its reserved ids "
                           "(gpt-oss's o200k_harmony vocabulary is not among the GGUFs); gpt-oss's own chat template"),
    "gemma-3": Family("gemma-4", "google-gemma-2-2b-it", "Gemma3", "<bos>", "<eos>", ("<eos>", "<end_of_turn>"), True,
                      pad="<pad>", renames={105: "<start_of_turn>", 106: "<end_of_turn>", 255999: "<start_of_image>",
                                            256000: "<end_of_image>"},
                      extra_tokens=("<image_soft_token>",), vocab_size=262208, config=GEMMA3_TEXT, vision=GEMMA3_VISION,
                      note="the multimodal checkpoint (Gemma3ForConditionalGeneration with its processor); Gemma 4's "
                           "262k vocabulary (Gemma 3's pieces; Gemma 3's tokenizer.model is not among the GGUFs) with "
                           "Gemma 3's turn and image tokens at their ids; Gemma 2's template (Gemma 3's is not in the "
                           "sdist: the same turn markers, but Gemma 3's also folds a system prompt into the first "
                           "user turn)"),
}


def cache_root() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/trainpilot-dev`` (where dev-setup.sh unpacks the sdist)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trainpilot-dev"


def sdist_root() -> Path | None:
    """The unpacked llama-cpp-python sdist (``$TRAINPILOT_LLAMA_SDIST`` or the dev cache), or None."""
    env = os.environ.get("TRAINPILOT_LLAMA_SDIST")
    root = Path(env) if env else cache_root() / SDIST_NAME
    return root if (root / "vendor" / "llama.cpp" / "models").is_dir() else None


def missing(what: str) -> None:
    """A tool the real-family tests need is not here: skip the test, but fail it under CI (``CI`` set), where the
    families must run, not skip silently (``.ci/run`` installs Go, the llama.cpp sources and llama-cpp-python)."""
    import pytest
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but {what}; the real-family tests must run in CI, not skip", pytrace=False)
    pytest.skip(what)


def llama_cpp_dir() -> Path:
    """``vendor/llama.cpp`` of the sdist (skips the calling test when it is absent; fails it in CI)."""
    root = sdist_root()
    if root is None:
        missing(f"the llama-cpp-python {SDIST_VERSION} source distribution is not unpacked under {cache_root()} "
                f"(run installers/linux/dev-setup.sh --dev, or set TRAINPILOT_LLAMA_SDIST)")
    return root / "vendor" / "llama.cpp"


def models_dir() -> Path:
    """llama.cpp's ``models/`` folder (vocab GGUFs, test vectors, ``templates/``)."""
    return llama_cpp_dir() / "models"


def template_text(name: str) -> str:
    """The real chat template of a family (``FAMILIES`` key) or a template file stem."""
    stem = FAMILIES[name].template if name in FAMILIES else name
    return (models_dir() / "templates" / f"{stem}.jinja").read_text(encoding="utf-8")


def test_vectors(vocab: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's tokenizer test vectors of a vocab: ``[(text, ids without bos)]``."""
    base = models_dir() / f"ggml-vocab-{vocab}.gguf"
    texts = base.with_name(base.name + ".inp").read_text(encoding="utf-8").split(TEST_SEPARATOR)
    outs = base.with_name(base.name + ".out").read_text(encoding="utf-8").split("\n")
    return [(t, [int(x) for x in o.split()]) for t, o in zip(texts, outs)]


def family_dir(name: str) -> Path:
    """The folder of one family's tiny model, built on first use (skips when the sdist is absent)."""
    fam = FAMILIES[name]
    src = models_dir()
    out = cache_root() / "real-models" / f"{SDIST_VERSION}-f{FORMAT}-{builder_hash()}" / name
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out.parent))
    os.chmod(tmp, 0o755)  # mkdtemp's 0700 would keep the folder from other users' tools
    try:
        _build(fam, src, tmp)
        try:
            tmp.rename(out)
        except OSError:  # another process built it first
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _build(fam: Family, src: Path, out: Path) -> None:
    import real_tokenizers
    tok = real_tokenizers.build_tokenizer(fam, src, out)
    tok.chat_template = (src / "templates" / f"{fam.template}.jinja").read_text(encoding="utf-8")
    tok.save_pretrained(out)
    real_tokenizers.finish_tokenizer_files(fam, out)
    _build_model(fam, tok, out)


def _build_model(fam: Family, tok, out: Path) -> None:
    import torch
    import transformers
    if fam.vision:
        return _build_image_text(fam, tok, out)
    cfg_cls = getattr(transformers, f"{fam.arch}Config")
    model_cls = getattr(transformers, f"{fam.arch}ForCausalLM")
    cfg = cfg_cls(**_text_config(fam, tok))
    if fam.arch == "Gemma2":
        cfg.query_pre_attn_scalar = 16
    torch.manual_seed(0)
    model = model_cls(cfg).to(torch.float32)
    _save(model, fam, tok, out)
    _hub_style_rope(out / "config.json", fam.config)


def _text_config(fam: Family, tok) -> dict:
    """The text model's config fields: hidden 64, 2 layers, the family's vocabulary, special ids and extras."""
    eot = [tok.convert_tokens_to_ids(t) for t in fam.end_of_turn]
    extra = {k: v for k, v in fam.config.items() if k not in ("rope_theta", "rope_scaling", "rope_local_base_freq")}
    rope = {"rope_type": "default", "rope_theta": fam.config.get("rope_theta", 10000.0),
            **fam.config.get("rope_scaling", {})}
    base = dict(vocab_size=fam.vocab_size or len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                bos_token_id=tok.bos_token_id, eos_token_id=eot[0] if len(eot) == 1 else eot,
                pad_token_id=tok.pad_token_id, rope_parameters=rope)
    return {**base, **extra}


def _save(model, fam: Family, tok, out: Path) -> None:
    eot = [tok.convert_tokens_to_ids(t) for t in fam.end_of_turn]
    model.generation_config.eos_token_id = eot
    model.generation_config.bos_token_id = tok.bos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)


def _build_image_text(fam: Family, tok, out: Path) -> None:
    """A multimodal checkpoint (``<arch>ForConditionalGeneration``): the text model as ``_text_config``, the
    vision tower and projector from ``fam.vision``, and the processor files the hub repo has
    (``preprocessor_config.json``, ``processor_config.json``), with the hub's rope keys in ``text_config``."""
    import torch
    import transformers
    vision = dict(fam.vision)
    text = _text_config(fam, tok)
    text.pop("rope_parameters")
    text.update(rope_scaling=fam.config.get("rope_scaling"), rope_theta=fam.config.get("rope_theta"),
                rope_local_base_freq=fam.config.get("rope_local_base_freq"))
    cfg = getattr(transformers, f"{fam.arch}Config")(text_config=text, **vision)
    cfg.eos_token_id, cfg.bos_token_id, cfg.pad_token_id = text["eos_token_id"], text["bos_token_id"], text["pad_token_id"]
    torch.manual_seed(0)
    model = getattr(transformers, f"{fam.arch}ForConditionalGeneration")(cfg).to(torch.float32)
    _save(model, fam, tok, out)
    path = out / "config.json"
    saved = json.loads(path.read_text(encoding="utf-8"))
    saved["text_config"].pop("rope_parameters", None)
    saved["text_config"].update({k: fam.config[k] for k in ("rope_scaling", "rope_theta", "rope_local_base_freq")})
    path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    _processor_files(fam, out)


def _processor_files(fam: Family, out: Path) -> None:
    """Gemma 3's processor files as google/gemma-3-4b-it has them, at the tiny tower's image size."""
    size = fam.vision["vision_config"]["image_size"]
    tokens = fam.vision["mm_tokens_per_image"]
    pre = {"do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None, "do_rescale": True,
           "do_resize": True, "image_mean": [0.5, 0.5, 0.5], "image_processor_type": f"{fam.arch}ImageProcessor",
           "image_seq_length": tokens, "image_std": [0.5, 0.5, 0.5], "pan_and_scan_max_num_crops": None,
           "pan_and_scan_min_crop_size": None, "pan_and_scan_min_ratio_to_activate": None,
           "processor_class": f"{fam.arch}Processor", "resample": 2, "rescale_factor": 1 / 255,
           "size": {"height": size, "width": size}}
    (out / "preprocessor_config.json").write_text(json.dumps(pre, indent=2) + "\n", encoding="utf-8")
    proc = {"image_seq_length": tokens, "processor_class": f"{fam.arch}Processor"}
    (out / "processor_config.json").write_text(json.dumps(proc, indent=2) + "\n", encoding="utf-8")


def _hub_style_rope(path: Path, wanted: dict) -> None:
    """config.json with ``rope_theta``/``rope_scaling`` as the families' hub files have them (what users
    download), instead of transformers 5's ``rope_parameters``, which it reads from the old keys too."""
    cfg = json.loads(path.read_text(encoding="utf-8"))
    params = cfg.pop("rope_parameters", None) or {}
    cfg["rope_theta"] = params.get("rope_theta", wanted.get("rope_theta", 10000.0))
    cfg["rope_scaling"] = wanted.get("rope_scaling")
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def main(argv: list[str]) -> int:
    """``--build [FAMILY...]``: build the cache (all families by default); prints each folder."""
    if not argv or argv[0] != "--build":
        print(__doc__)
        return 2
    if sdist_root() is None:
        print(f"no llama-cpp-python {SDIST_VERSION} sdist under {cache_root()}; run installers/linux/dev-setup.sh --dev",
              file=sys.stderr)
        return 1
    for name in argv[1:] or list(FAMILIES):
        print(name, family_dir(name), flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main(sys.argv[1:]))
