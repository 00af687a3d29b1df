"""Worker side: build the tokenizer and the model (full, LoRA or QLoRA) from the run config.

Heavy imports (torch, transformers, peft) happen inside functions: only the worker calls these.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from trainer.config.resolved import resolve_dtype
from trainer.core import secrets
from trainer.core.errors import UserError
from trainer.data import conversations
from trainer.data.readers import bundled_demo_path
from trainer.models.sources import DEMO_MODEL, architecture_file, tokenizer_source
from trainer.worker.datapipe import tokenizer as model_tokenizer
from trainer.worker.datapipe.corpus import corpus_tokenizer
from trainer.worker.datapipe.tokenizer import demo_tokenizer
from trainer.worker.loading import device_map, kbit, model_parts, sentencepiece_reading


def load_tokenizer(cfg, saved: Path | None = None):
    """The tokenizer of a run, with a pad token (eos when the model has none) and the run's date pinned in its chat
    template: the one saved in ``saved`` (``final/``, a checkpoint: what training read, with its chat template),
    else the run's own, as training, generation, chat and export all load it (``run_tokenizer``)."""
    if saved is not None and (saved / "tokenizer_config.json").is_file():
        # a folder saved before TrainPilot kept tokenizer.model (a fast tokenizer's save drops it): the source's
        tok = model_tokenizer.load_pretrained(saved, sentencepiece_file=source_sentencepiece_model(cfg))
    else:
        tok = run_tokenizer(cfg)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    conversations.pin_date(tok, cfg.data.chat_date)  # a template printing today's date prints the run's
    return tok


def run_tokenizer(cfg):
    """The tokenizer the run trains with: the demo's or the corpus' (trained here), else the model's own as its
    files describe it (``model_tokenizer.load_pretrained``), read as its SentencePiece model reads text where the
    shipped tokenizer.json reads it otherwise (``sentencepiece_reading.choose``)."""
    src = tokenizer_source(cfg)
    if src == "demo":
        return demo_tokenizer(bundled_demo_path())
    if src == "corpus":
        return corpus_tokenizer(cfg)
    kwargs = dict(revision=cfg.model.revision, token=secrets.hub_token(cfg), trust_remote_code=cfg.model.trust_remote_code)
    try:
        tok = model_tokenizer.load_pretrained(src, **kwargs)
    except (OSError, ValueError) as exc:
        raise UserError(f"model.tokenizer: cannot load a tokenizer from '{src}' ({secrets.redact(str(exc)).splitlines()[0]}); "
                        f"set model.tokenizer to a folder or hub id with tokenizer files", field="model.tokenizer") from None
    return sentencepiece_reading.choose(tok, str(src), lambda: model_tokenizer.load_pretrained(src, as_written=True,
                                                                                              **kwargs))


def source_sentencepiece_model(cfg) -> Path | None:
    """``tokenizer.model`` of the run's tokenizer source (a local folder, or the hub cache; nothing is downloaded),
    for a model saved before TrainPilot kept it (a fast tokenizer's save does not write it)."""
    src = tokenizer_source(cfg)
    return None if src in (None, "demo", "corpus") else model_tokenizer.shipped_file(src, "tokenizer.model",
                                                                                     cfg.model.revision)


def torch_dtype(cfg, precision: str):
    """The dtype weights are loaded in."""
    import torch

    return getattr(torch, resolve_dtype(cfg.model.dtype, precision))


def load_model(cfg, precision: str, use_cuda: bool, vocab_size: int | None = None, apply_method: bool = True,
               seq2seq: bool = False):
    """The model ready for training: full, LoRA or QLoRA; gradient checkpointing per config.
    ``vocab_size`` (a tokenizer trained on the corpus) sizes the embeddings to that tokenizer;
    ``apply_method=False`` returns the base model (TRL's trainers wrap it in the adapters themselves);
    ``seq2seq`` builds an encoder-decoder (T5) with its LM head."""
    import torch
    from transformers import AutoConfig

    m = cfg.model
    dtype = torch_dtype(cfg, precision)
    common = dict(attn_implementation=m.attn_implementation, trust_remote_code=m.trust_remote_code)
    if m.architecture or m.source == DEMO_MODEL:
        arch = architecture_file(m.architecture or "tiny-llama")
        conf = AutoConfig.for_model(**{k: v for k, v in json.loads(arch.read_text()).items() if not k.startswith("_")})
        if vocab_size:
            conf.vocab_size = vocab_size
        auto = model_parts.auto_class(conf, seq2seq)
        torch.manual_seed(cfg.training.seed)
        # Random init straight on the GPU: on the CPU it takes about a minute per billion parameters
        # (measured on the H100 machine: 95 s before Llama-3.2-1B's first step). DeepSpeed starts
        # from host memory, so its models are still built there.
        where = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if use_cuda and cfg.deepspeed.enabled is not True else "cpu"
        split = split_map(cfg, use_cuda, lambda: device_map.skeleton(conf, auto, common))
        if cfg.method.type == "qlora":  # 4-bit from the start: the 16-bit model would not fit where QLoRA is needed
            model = _with_attention_fallback(
                lambda kw: kbit.random_4bit_model(auto, conf, dtype, split or where, kw, precision), common)
            if split:
                model = device_map.dispatch(model, split)
        else:
            with torch.device("cpu" if split else where):  # split: built in host memory, then onto its cards
                model = _with_attention_fallback(lambda kw: auto.from_config(conf, dtype=dtype, **kw),
                                                 common)
            if split:
                model = device_map.dispatch(model, split)
    else:
        kwargs = dict(dtype=dtype, revision=m.revision, token=secrets.hub_token(cfg))
        if cfg.method.type == "qlora":
            keep = model_parts.PROJECTOR_NAMES if cfg.method.train_vision != "none" else ()
            kwargs["quantization_config"] = kbit.quantization_config(precision, keep)
            kwargs["device_map"] = {"": torch.cuda.current_device()}
        try:
            source_conf = _source_config(cfg)
            auto = model_parts.auto_class(source_conf, seq2seq)
            split = split_map(cfg, use_cuda, lambda: device_map.skeleton(source_conf, auto, common))
            if split:  # each module's weights straight onto its card (QLoRA's Linears quantised there)
                kwargs["device_map"] = split
            model = _with_attention_fallback(lambda kw: auto.from_pretrained(m.source, **{**kwargs, **kw}),
                                             common)
        except OSError as exc:
            raise UserError(f"model.source: cannot load '{m.source}' ({secrets.redact(str(exc)).splitlines()[0]}); "
                            f"check the hub id, your access to it ({m.hub_token_env}) or the folder", field="model.source") from None
    if vocab_size and model.get_input_embeddings().weight.shape[0] != vocab_size:
        model.resize_token_embeddings(vocab_size)
    return prepare_built(cfg, model, apply_method, seq2seq)


def split_map(cfg, use_cuda: bool, skeleton) -> dict | None:
    """The ``device_map`` of a run whose layers are split over its cards (``distributed.layer_split: true`` on a
    GPU), from the module names of ``skeleton()`` (the model on the meta device); None otherwise."""
    if cfg.distributed.layer_split is not True or not use_cuda:
        return None
    return device_map.planned_map(cfg, skeleton(), device_map.cards_of(cfg))


def prepare_built(cfg, model, apply_method: bool = True, seq2seq: bool = False):
    """What ``load_model`` does to a built model, in its order: no KV cache, the towers frozen, the tiled MLP, then
    the method (LoRA through ``lora_config``). The simulated step (``probes/simulate.py``) calls it on a model
    built on the meta device, so it trains what the run trains."""
    model.config.use_cache = False
    model_parts.freeze_towers(model, cfg.method.train_vision)  # vision parts train only when asked
    if cfg.speed.tiled_mlp is True:  # before the adapters: tiling wraps the MLP's call, whatever is inside it later
        from trainer.worker.kernels import tiled_mlp

        tiled_mlp.install(model)
    if not apply_method:
        return model
    return _apply_method(cfg, model, "SEQ_2_SEQ_LM" if seq2seq else "CAUSAL_LM")


def _source_config(cfg):
    """The config of ``model.source`` (a folder or hub id), read before the weights to pick the model class."""
    from transformers import AutoConfig

    m = cfg.model
    return AutoConfig.from_pretrained(m.source, revision=m.revision, token=secrets.hub_token(cfg),
                                      trust_remote_code=m.trust_remote_code)


def _with_attention_fallback(build, common: dict):
    """Build with the configured attention; some architectures (Gemma 2) refuse sdpa: use eager then."""
    try:
        return build(common)
    except ValueError as exc:
        if "does not support an attention implementation" not in str(exc) or common["attn_implementation"] == "eager":
            raise
        print(f"trainpilot: {str(exc).split('.')[0]}; using eager attention (the planner estimates it so)",
              file=sys.stderr)
        return build(dict(common, attn_implementation="eager"))


def lora_config(cfg, model, task_type: str = "CAUSAL_LM"):
    """PEFT LoraConfig from ``method`` (UserError for target modules the model lacks; the targets of MoE and
    multimodal models: ``model_parts.lora_targets``); for QLoRA the 4-bit model is prepared for training first, in
    place (``kbit.prepare_kbit_model``: embedding, head and norms stay 16-bit, unlike peft's
    ``prepare_model_for_kbit_training``)."""
    from peft import LoraConfig

    method = cfg.method
    targets, experts = model_parts.lora_targets(method, model)
    if method.type == "qlora":
        kbit.prepare_kbit_model(model, checkpointing=cfg.speed.gradient_checkpointing is True)
    return LoraConfig(r=method.lora_r, lora_alpha=method.lora_alpha, lora_dropout=method.lora_dropout,
                      target_modules=targets, target_parameters=experts or None, task_type=task_type,
                      modules_to_save=model_parts.vision_modules_to_save(method, model) or None)


def _apply_method(cfg, model, task_type: str = "CAUSAL_LM"):
    if cfg.method.type == "full":
        return model
    import torch
    from peft import get_peft_model

    # The adapters' random initialisation follows training.seed: torch 2.13 seeds its default generator from the OS
    # at start, so without this two runs of one config (and the ranks of one run) began from different adapters.
    torch.manual_seed(cfg.training.seed)
    model = get_peft_model(model, lora_config(cfg, model, task_type))
    if cfg.speed.gradient_checkpointing is True:
        model.enable_input_require_grads()  # checkpointed frozen embeddings need grads flowing in
    return model
