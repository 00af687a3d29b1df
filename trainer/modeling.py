"""Worker side: build the tokenizer and the model (full, LoRA or QLoRA) from the run config.

Heavy imports (torch, transformers, peft) happen inside functions: only the worker calls these.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from trainer import secrets
from trainer.errors import UserError

DEMO_MODEL = "demo-tiny-llama"
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def configs_dir() -> Path:
    """The repository's ``configs/`` folder (presets, architectures, DeepSpeed templates)."""
    return Path(__file__).resolve().parent.parent / "configs"


def architecture_file(name: str) -> Path:
    """Path of an architecture: a config.json path, or a name in configs/models/ (UserError if neither)."""
    p = Path(name).expanduser()
    if p.is_file():
        return p
    if p.is_dir() and (p / "config.json").is_file():
        return p / "config.json"
    shipped = configs_dir() / "models" / f"{name}.json"
    if shipped.is_file():
        return shipped
    names = sorted(f.stem for f in (configs_dir() / "models").glob("*.json"))
    raise UserError(f"model.architecture: '{name}' is neither a config.json file nor a shipped architecture; "
                    f"use one of: {', '.join(names)}", field="model.architecture")


def is_local(source: str) -> bool:
    """True when ``source`` looks like a path rather than a hub id."""
    return source.startswith((".", "/", "~", "\\")) or os.path.isabs(source) or Path(source).expanduser().exists() \
        or (len(source) > 1 and source[1] == ":")


def check_model_source(cfg) -> None:
    """Cheap checks of the model folder (no torch): exists, readable, has config.json and weights."""
    m = cfg.model
    if m.architecture or m.source == DEMO_MODEL:
        if m.architecture:
            architecture_file(m.architecture)
        return
    if not is_local(m.source):
        return  # a hub id: checked when downloading
    p = Path(m.source).expanduser()
    if not p.exists():
        raise UserError(f"model.source: model folder not found: {p}; check the path or use a hub id like "
                        f"meta-llama/Llama-3.2-1B", field="model.source", path=str(p))
    if not p.is_dir() or not os.access(p, os.R_OK | os.X_OK):
        raise UserError(f"model.source: cannot read the model folder {p}; check that it is a folder you may read",
                        field="model.source", path=str(p))
    if not (p / "config.json").is_file():
        raise UserError(f"model.source: {p} has no config.json; point it at the folder that holds config.json "
                        f"and the weights", field="model.source", path=str(p))
    if not any((p / f).is_file() for f in _WEIGHT_FILES) and not m.architecture:
        raise UserError(f"model.source: {p} has config.json but no weights (model.safetensors); copy the weights "
                        f"there, or set model.architecture to train from random weights", field="model.source", path=str(p))


def check_tokenizer_source(cfg) -> None:
    """Cheap check that a local tokenizer folder has tokenizer files."""
    src = tokenizer_source(cfg)
    if src in ("demo", None) or not is_local(src):
        return
    p = Path(src).expanduser()
    if not p.is_dir() or not any((p / f).is_file() for f in _TOKENIZER_FILES):
        key = "model.tokenizer" if cfg.model.tokenizer else "model.source"
        raise UserError(f"{key}: no tokenizer in {p} (tokenizer.json or tokenizer.model); copy the tokenizer files "
                        f"there or set model.tokenizer to a folder or hub id that has them", field=key, path=str(p))


def tokenizer_source(cfg) -> str | None:
    """Where the tokenizer comes from: model.tokenizer, else the source ('demo' for the demo model)."""
    m = cfg.model
    if m.tokenizer:
        return m.tokenizer
    if m.source == DEMO_MODEL or (m.architecture and m.source == DEMO_MODEL):
        return "demo"
    return m.source


def load_tokenizer(cfg):
    """The tokenizer, with a pad token (eos when the model has none)."""
    from transformers import AutoTokenizer

    src = tokenizer_source(cfg)
    if src == "demo":
        from trainer.datafile import bundled_demo_path
        from trainer.demo import demo_tokenizer

        tok = demo_tokenizer(bundled_demo_path())
    else:
        try:
            tok = AutoTokenizer.from_pretrained(src, revision=cfg.model.revision, token=secrets.hub_token(cfg),
                                                trust_remote_code=cfg.model.trust_remote_code)
        except (OSError, ValueError) as exc:
            raise UserError(f"model.tokenizer: cannot load a tokenizer from '{src}' ({secrets.redact(str(exc)).splitlines()[0]}); "
                            f"set model.tokenizer to a folder or hub id with tokenizer files", field="model.tokenizer") from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def torch_dtype(cfg, precision: str):
    """The dtype weights are loaded in."""
    import torch

    name = cfg.model.dtype
    if name == "auto":
        name = {"bf16": "bfloat16", "fp16": "float32", "fp32": "float32"}[precision]  # fp16 AMP needs fp32 masters
    return getattr(torch, name)


def load_model(cfg, precision: str, use_cuda: bool):
    """The model ready for training: full, LoRA or QLoRA; gradient checkpointing per config."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    m = cfg.model
    dtype = torch_dtype(cfg, precision)
    common = dict(attn_implementation=m.attn_implementation, trust_remote_code=m.trust_remote_code)
    if m.architecture or m.source == DEMO_MODEL:
        arch = architecture_file(m.architecture or "tiny-llama")
        conf = AutoConfig.for_model(**{k: v for k, v in json.loads(arch.read_text()).items() if not k.startswith("_")})
        torch.manual_seed(cfg.training.seed)
        # Random init straight on the GPU: on the CPU it takes about a minute per billion parameters
        # (measured on the H100 machine: 95 s before Llama-3.2-1B's first step). DeepSpeed starts
        # from host memory, so its models are still built there.
        where = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if use_cuda and cfg.deepspeed.enabled is not True else "cpu"
        with torch.device(where):
            model = _with_attention_fallback(lambda kw: AutoModelForCausalLM.from_config(conf, dtype=dtype, **kw),
                                             common)
    else:
        kwargs = dict(dtype=dtype, revision=m.revision, token=secrets.hub_token(cfg))
        if cfg.method.type == "qlora":
            kwargs["quantization_config"] = _bnb_config(precision)
            kwargs["device_map"] = {"": torch.cuda.current_device()}
        try:
            model = _with_attention_fallback(lambda kw: AutoModelForCausalLM.from_pretrained(m.source, **{**kwargs, **kw}),
                                             common)
        except OSError as exc:
            raise UserError(f"model.source: cannot load '{m.source}' ({secrets.redact(str(exc)).splitlines()[0]}); "
                            f"check the hub id, your access to it ({m.hub_token_env}) or the folder", field="model.source") from None
    model.config.use_cache = False
    return _apply_method(cfg, model)


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


def _bnb_config(precision: str):
    import torch
    from transformers import BitsAndBytesConfig

    compute = torch.bfloat16 if precision == "bf16" else torch.float16
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=compute)


def _apply_method(cfg, model):
    method = cfg.method
    if method.type == "full":
        return model
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    _check_target_modules(method.target_modules, model)
    if method.type == "qlora":
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=bool(cfg.speed.gradient_checkpointing))
    lora = LoraConfig(r=method.lora_r, lora_alpha=method.lora_alpha, lora_dropout=method.lora_dropout,
                      target_modules=method.target_modules, task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    if cfg.speed.gradient_checkpointing is True:
        model.enable_input_require_grads()  # checkpointed frozen embeddings need grads flowing in
    return model


def _check_target_modules(targets, model) -> None:
    """UserError (exit 2) when a LoRA target names no Linear layer of the model; PEFT would raise for
    all-unknown names and silently skip a single misspelled one."""
    if targets == "all-linear":
        return
    import difflib

    import torch

    linear = sorted({name.rsplit(".", 1)[-1] for name, mod in model.named_modules()
                     if isinstance(mod, torch.nn.Linear) or type(mod).__name__ == "Conv1D"})
    unknown = [t for t in targets if t not in linear]
    if unknown:
        hints = [f"{t} → {m[0]}" for t in unknown if (m := difflib.get_close_matches(t, linear, n=1))]
        raise UserError(f"method.target_modules: {', '.join(unknown)} not in this model"
                        + (f" (did you mean {'; '.join(hints)}?)" if hints else "")
                        + f"; its linear layers are: {', '.join(linear)} (or use all-linear)",
                        field="method.target_modules")
