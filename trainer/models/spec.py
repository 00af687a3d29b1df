"""Model architecture facts from a ``config.json``, with exact parameter counts. No torch.

Sources, in order: a ``config.json`` path; a local model folder; a name in ``trainer/resources/models/``
(``demo-tiny-llama`` is the bundled demo); a hub id shipped there under its own name; the Hugging
Face cache (``$HF_HUB_CACHE`` or ``$HF_HOME/hub`` or ``~/.cache/huggingface/hub``). Nothing downloads.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from trainer.core.errors import UserError
from trainer.core.paths import MODELS_DIR, hf_hub_cache
from trainer.models import catalog
from trainer.models.sources import is_local

LLAMA_LIKE = {"llama", "mistral", "qwen2", "gemma", "gemma2", "qwen3"}
ENCODER_DECODER = {"t5"}
FAMILIES = sorted(LLAMA_LIKE | {"phi", "stablelm", "gpt2"} | ENCODER_DECODER)


class ModelSpecNotFound(UserError):
    """No config.json could be found for the model (the planner reports "fits unknown")."""


@dataclass(frozen=True)
class ModelSpec:
    """Architecture numbers of a causal LM. Counts are parameters (not bytes)."""

    name: str
    family: str  # the config's model_type
    params: int  # unique parameters (tied embeddings counted once)
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int
    tied_embeddings: bool
    embedding_params: int  # token (+ position) embeddings
    layer_params: int  # one decoder layer
    lm_head_params: int  # 0 when tied
    linear_shapes: tuple[tuple[int, int], ...]  # (in, out) of each Linear in one layer (LoRA targets)
    source: str = ""
    # encoder-decoder (T5): ``layers``/``layer_params``/``linear_shapes`` describe the encoder; these the decoder
    decoder_layers: int = 0
    decoder_layer_params: int = 0
    decoder_linear_shapes: tuple[tuple[int, int], ...] = ()

    @property
    def encoder_decoder(self) -> bool:
        """True for encoder-decoder models (T5): input goes to the encoder, the target to the decoder."""
        return self.decoder_layers > 0

    @property
    def kv_width(self) -> int:
        """Width of the K (or V) projection output: kv_heads × head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def largest_layer_params(self) -> int:
        """Largest single module (DeepSpeed ZeRO-3 gathers one at a time): embedding or lm_head here."""
        return max(self.vocab * self.hidden, max(i * o for i, o in self.linear_shapes))


def _get(cfg: dict, *names: str, default=None):
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return default


def spec_from_config(cfg: dict, name: str = "", source: str = "") -> ModelSpec:
    """Count parameters exactly from a config.json dict. UserError for an unsupported family."""
    family = str(cfg.get("model_type") or "").lower()
    if family not in FAMILIES:
        raise UserError(f"model '{name}': architecture family '{family or '?'}' is not known to the memory "
                        f"estimator (known: {', '.join(FAMILIES)}); set training values instead of 'auto'")
    if family in ENCODER_DECODER:
        return _t5_spec(cfg, name, source)
    h = int(_get(cfg, "hidden_size", "n_embd"))
    layers = int(_get(cfg, "num_hidden_layers", "n_layer"))
    heads = int(_get(cfg, "num_attention_heads", "n_head"))
    kv = int(_get(cfg, "num_key_value_heads", default=heads))
    hd = int(_get(cfg, "head_dim", default=h // heads))
    inter = int(_get(cfg, "intermediate_size", "n_inner", default=4 * h))
    vocab = int(cfg["vocab_size"])
    tied = bool(cfg.get("tie_word_embeddings", family in ("gemma", "gemma2", "gpt2")))
    counter = {"phi": _phi_layer, "stablelm": _stablelm_layer, "gpt2": _gpt2_layer}.get(family, _llama_layer)
    layer, shapes, final_norm, head_bias = counter(cfg, family, h, heads, kv, hd, inter)
    max_pos = int(_get(cfg, "max_position_embeddings", "n_positions", default=2048))
    embed = vocab * h + (max_pos * h if family == "gpt2" else 0)
    head = 0 if tied else vocab * h + head_bias * vocab
    total = embed + layers * layer + final_norm + head
    return ModelSpec(name, family, total, layers, h, heads, kv, hd, inter, vocab, max_pos, tied, embed, layer,
                     head, tuple(shapes), source)


def _llama_layer(cfg, family, h, heads, kv, hd, inter):
    """Llama, Mistral, Qwen2/3, Gemma 1/2: q,k,v,o + gated MLP + RMSNorms (no bias by default)."""
    q, k = heads * hd, kv * hd
    attn_bias = bool(cfg.get("attention_bias", family == "qwen2"))
    mlp_bias = bool(cfg.get("mlp_bias", False))
    shapes = [(h, q), (h, k), (h, k), (q, h), (h, inter), (h, inter), (inter, h)]
    bias = (q + 2 * k) * attn_bias + (h if attn_bias and family != "qwen2" else 0) + mlp_bias * (2 * inter + h)
    norms = {"gemma2": 4 * h}.get(family, 2 * h) + (2 * hd if family == "qwen3" else 0)
    return sum(i * o for i, o in shapes) + bias + norms, shapes, h, 0


def _phi_layer(cfg, family, h, heads, kv, hd, inter):
    """Phi-1/2: biased q,k,v,dense and fc1,fc2; one LayerNorm per layer; biased lm_head."""
    q, k = heads * hd, kv * hd
    shapes = [(h, q), (h, k), (h, k), (q, h), (h, inter), (inter, h)]
    bias = q + 2 * k + h + inter + h
    qk_norm = 2 * 2 * hd if cfg.get("qk_layernorm") else 0
    return sum(i * o for i, o in shapes) + bias + 2 * h + qk_norm, shapes, 2 * h, 1


def _stablelm_layer(cfg, family, h, heads, kv, hd, inter):
    """StableLM 2: q,k,v (bias when use_qkv_bias), o, gated MLP, two LayerNorms with bias."""
    q, k = heads * hd, kv * hd
    shapes = [(h, q), (h, k), (h, k), (q, h), (h, inter), (h, inter), (inter, h)]
    bias = (q + 2 * k) if cfg.get("use_qkv_bias") else 0
    norms = 2 * h if cfg.get("use_parallel_residual") else 4 * h
    qk_norm = 2 * (heads + kv) * hd if cfg.get("qk_layernorm") else 0
    return sum(i * o for i, o in shapes) + bias + norms + qk_norm, shapes, 2 * h, 0


def _gpt2_layer(cfg, family, h, heads, kv, hd, inter):
    """GPT-2: fused qkv Conv1D, proj, 4h MLP, all biased; two LayerNorms with bias."""
    shapes = [(h, 3 * h), (h, h), (h, inter), (inter, h)]
    bias = 3 * h + h + inter + h
    return sum(i * o for i, o in shapes) + bias + 4 * h, shapes, 2 * h, 0


def _t5_spec(cfg: dict, name: str, source: str) -> ModelSpec:
    """T5 / FLAN-T5: shared embedding; encoder layers (self-attention, FF) and decoder layers (self-attention,
    cross-attention, FF), each sub-layer with an RMS norm; relative position bias in each stack's first layer;
    gated-GELU FF (v1.1/FLAN) or plain ReLU FF (original T5)."""
    h, ff, heads, dkv = int(cfg["d_model"]), int(cfg["d_ff"]), int(cfg["num_heads"]), int(cfg["d_kv"])
    layers = int(cfg["num_layers"])
    dec_layers = int(cfg.get("num_decoder_layers") or layers)
    vocab, inner = int(cfg["vocab_size"]), heads * dkv
    gated = str(cfg.get("feed_forward_proj", "relu")).startswith("gated") or bool(cfg.get("is_gated_act"))
    attn = [(h, inner), (h, inner), (h, inner), (inner, h)]
    mlp = [(h, ff), (h, ff), (ff, h)] if gated else [(h, ff), (ff, h)]
    enc_shapes, dec_shapes = attn + mlp, attn + attn + mlp
    enc_layer = sum(i * o for i, o in enc_shapes) + 2 * h
    dec_layer = sum(i * o for i, o in dec_shapes) + 3 * h
    bias = 2 * int(cfg.get("relative_attention_num_buckets", 32)) * heads  # one table per stack
    # transformers 5 ties T5's lm_head to the shared embedding whatever tie_word_embeddings says
    # (T5Config forces it; the flag only decides the decoder-output scaling), so the head is counted once.
    tied, head = True, 0
    total = vocab * h + layers * enc_layer + dec_layers * dec_layer + 2 * h + bias + head
    return ModelSpec(name, "t5", total, layers, h, heads, heads, dkv, ff, vocab, int(cfg.get("n_positions") or 512),
                     tied, vocab * h, enc_layer, head, tuple(enc_shapes), source, dec_layers, dec_layer,
                     tuple(dec_shapes))


def is_encoder_decoder(source_or_arch: str) -> bool:
    """Whether the model's config.json (found locally) describes an encoder-decoder; False when not found."""
    path = find_config(source_or_arch)
    if path is None:
        return False
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    return bool(cfg.get("is_encoder_decoder")) or str(cfg.get("model_type", "")).lower() in ENCODER_DECODER


def find_config(source: str) -> Optional[Path]:
    """Path of the config.json describing ``source``, or None. Never touches the network."""
    p = Path(source).expanduser()
    try:
        if p.is_file():
            return p
        if p.is_dir() and (p / "config.json").is_file():
            return p / "config.json"
    except OSError:  # unreadable folder: preflight reports it with the fix
        return None
    key = source.strip().lower()
    for name in (catalog.architecture_of(key), key, key.rsplit("/", 1)[-1]):
        if name and (MODELS_DIR / f"{name}.json").is_file():
            return MODELS_DIR / f"{name}.json"
    if "/" in source:
        folder = "models--" + source.strip().replace("/", "--")
        snaps = sorted((hf_hub_cache() / folder / "snapshots").glob("*/config.json"), key=lambda f: f.stat().st_mtime)
        if snaps:
            return snaps[-1]
    return None


def not_found_message(source: str) -> str:
    """Why no config.json describes ``source``, in the user's terms (their path or hub id, never TrainPilot's own
    folders), with the fix: a folder that is not there, a folder without config.json, a hub model not downloaded."""
    if is_local(source):
        p = Path(source).expanduser()
        if not p.exists():
            return f"model folder not found: {source}; check the path (a folder holding config.json and the weights)"
        return f"{p} has no config.json; choose the folder that holds the model's config.json and weights"
    shipped = ", ".join(sorted(f.stem for f in MODELS_DIR.glob("*.json")))
    return (f"{source} is not downloaded (its config.json is not on this computer); download it first (the model "
            f"picker's Download…, or huggingface-cli download {source}), or to train a shipped architecture from "
            f"random weights set model.architecture to one of: {shipped}")


def load_model_spec(source_or_arch: str) -> ModelSpec:
    """ModelSpec for a config path, model folder, shipped architecture name or cached hub id.
    Raises ModelSpecNotFound (a UserError) when no config.json is available locally."""
    path = find_config(source_or_arch)
    if path is None:
        raise ModelSpecNotFound(not_found_message(source_or_arch))
    try:
        stamp = path.stat().st_mtime_ns
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc}; is it a valid config.json?", path=str(path)) from None
    return _spec_of_file(str(path), stamp, source_or_arch)


@functools.lru_cache(maxsize=64)
def _spec_of_file(path: str, mtime_ns: int, name: str) -> ModelSpec:
    """Parsed once per file version: a plan's alternatives ask for the same model many times."""
    try:
        cfg = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}; is it a valid config.json?", path=path) from None
    return spec_from_config(cfg, name=name, source=path)


def spec_for_run(cfg) -> ModelSpec:
    """The spec of a RunConfig's model: ``model.architecture`` when set, else ``model.source``."""
    return load_model_spec(cfg.model.architecture or cfg.model.source)
