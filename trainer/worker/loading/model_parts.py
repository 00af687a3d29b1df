"""Which parts of a model train, for the architectures whose parts differ.

- Multimodal checkpoints (``…ForConditionalGeneration``: Gemma 3/4, Qwen3.5, Mistral 3, LLaVA, Idefics3) are
  loaded through their own class (``AutoModelForImageTextToText``: ``AutoModelForCausalLM`` maps Qwen3.5 to its
  text-only class and refuses Mistral 3), trained on text: the vision/audio towers and the projector are
  frozen (no gradients, no optimizer states) and never LoRA targets, and are saved unchanged with the
  processor files, so the result loads with the original class and processor.
- Mixture-of-experts models: transformers 5 stores the experts as fused 3-D parameters
  (``Qwen3MoeExperts.gate_up_proj``/``down_proj``, ``GptOssExperts``), which LoRA reaches only through PEFT's
  ``target_parameters`` (``lora.ParamWrapper``, which refuses adapter dropout). PEFT 0.21 adds them itself
  for model types with a v4→v5 weight conversion (Qwen3-MoE's): ``_convert_peft_config_moe`` resolves
  ``all-linear`` to every linear name *plus* the v4 expert and router names (gate_proj, up_proj, down_proj,
  gate) and turns those into ``target_parameters`` {gate_up_proj, down_proj, gate.weight} — experts and
  router — hence "ParamWrapper does not work with lora_dropout != 0" on a default config. So for these
  models the targets are given as exact module names, which that conversion leaves alone, and the experts
  are added only with ``method.lora_experts``.

Heavy imports (torch, transformers, peft) happen inside functions: only the worker calls these.
"""
from __future__ import annotations

import difflib
import shutil
from pathlib import Path

from trainer.core import secrets
from trainer.core.errors import UserError
from trainer.models.sources import is_local, tokenizer_source
from trainer.planning import adapters

TOWER_CONFIGS = ("vision_config", "audio_config")  # sub-configs of the parts a text run does not train
# What a multimodal repo's processor reads besides the tokenizer (the tokenizer saves its own files)
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")


def is_multimodal(conf) -> bool:
    """True for a checkpoint with vision/audio towers that transformers builds as an image-text-to-text model."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    towers = any(getattr(conf, name, None) is not None for name in TOWER_CONFIGS)
    return towers and getattr(conf, "model_type", None) in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES


def auto_class(conf, seq2seq: bool = False):
    """The transformers Auto class that builds the whole checkpoint of ``conf`` with its LM head."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForSeq2SeqLM

    if seq2seq:
        return AutoModelForSeq2SeqLM
    return AutoModelForImageTextToText if is_multimodal(conf) else AutoModelForCausalLM


def _base(model):
    """The transformers model inside a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def tower_prefixes(model) -> list[str]:
    """Module names of the parts beside the text decoder (``model.vision_tower``, ``model.multi_modal_projector``,
    ``model.visual``...); empty for a text-only model."""
    base = _base(model)
    if not is_multimodal(base.config) or not hasattr(base, "get_decoder"):
        return []
    decoder = base.get_decoder()
    name = next((n for n, m in base.named_modules() if m is decoder), None)
    if not name or "." not in name:
        return []
    parent, _, own = name.rpartition(".")
    prefix = model_prefix(model)
    return [f"{prefix}{parent}.{child}" for child, mod in base.get_submodule(parent).named_children()
            if child != own and any(True for _ in mod.parameters())]


def model_prefix(model) -> str:
    """What PEFT puts before the base model's parameter names (``base_model.model.``), or ""."""
    return "base_model.model." if hasattr(model, "get_base_model") else ""


def _in(name: str, prefixes: list[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def freeze_towers(model) -> int:
    """Freeze the towers and projector of a multimodal checkpoint; returns how many parameters were frozen."""
    towers = tower_prefixes(model)
    frozen = 0
    for name, param in model.named_parameters():
        if _in(name, towers):
            param.requires_grad_(False)
            frozen += param.numel()
    return frozen


def text_linears(model, head: bool = False) -> list[str]:
    """Full names of the linear layers LoRA may adapt: ``nn.Linear``/``Conv1D`` outside the towers, without the
    output head unless ``head`` (PEFT's ``all-linear`` rule, restricted to the text model)."""
    import torch

    towers = tower_prefixes(model)
    out_head = None if head or not hasattr(model, "get_output_embeddings") else model.get_output_embeddings()
    return [name for name, mod in model.named_modules()
            if (isinstance(mod, torch.nn.Linear) or type(mod).__name__ == "Conv1D") and mod is not out_head
            and not _in(name, towers)]


def fused_experts(model) -> list[tuple[str, int]]:
    """``(parameter name, experts)`` of every fused expert weight outside the towers: a 3-D parameter of an
    ``…Experts`` module (biases, 2-D, are not adapted)."""
    towers = tower_prefixes(model)
    found = []
    for owner_name, owner in model.named_modules():
        if not type(owner).__name__.endswith("Experts") or _in(owner_name, towers):
            continue
        for pname, param in owner.named_parameters(recurse=False):
            if param.ndim == 3:
                found.append((f"{owner_name}.{pname}", int(param.shape[0])))
    return found


def check_target_modules(targets, linear_leaves: set[str]) -> None:
    """UserError (exit 2) when a LoRA target names no linear layer of the model; PEFT would raise for all-unknown
    names and silently skip a single misspelled one."""
    if targets == "all-linear":
        return
    linear = sorted(linear_leaves)
    unknown = [t for t in targets if t not in linear_leaves]
    if unknown:
        hints = [f"{t} → {m[0]}" for t in unknown if (m := difflib.get_close_matches(t, linear, n=1))]
        raise UserError(f"method.target_modules: {', '.join(unknown)} not in this model"
                        + (f" (did you mean {'; '.join(hints)}?)" if hints else "")
                        + f"; its linear layers are: {', '.join(linear)} (or use all-linear)",
                        field="method.target_modules")


def lora_targets(method, model) -> tuple[str | list[str], list[str]]:
    """``(target_modules, target_parameters)`` for PEFT's LoraConfig. A text model without fused experts keeps the
    config's value as written; otherwise exact module names of the text model, and the experts' parameters only
    with ``method.lora_experts``. UserError for names the model lacks, or experts asked of a model without any."""
    experts = fused_experts(model)
    if method.lora_experts and not experts:
        raise UserError("method.lora_experts: this model has no fused expert weights (it is not a mixture of "
                        "experts, or stores its experts as separate linear layers, which all-linear adapts "
                        "already); set method.lora_experts: false", field="method.lora_experts")
    names = text_linears(model, head=method.target_modules != "all-linear")
    check_target_modules(method.target_modules, {n.rsplit(".", 1)[-1] for n in names})
    if not experts and not tower_prefixes(model):
        return method.target_modules, []
    names = [n for n in names if adapters.matches(n, method.target_modules)]  # the one rule (planning/adapters)
    renamed = _renamed_by_peft(model, names)
    _base(model).tp_not_adapted = sorted(renamed)  # part_warnings says so
    names = [n for n in names if n not in renamed]
    if not names and not method.lora_experts:
        raise UserError("method.target_modules: PEFT maps these layer names to the fused experts of this model; "
                        "target attention layers (q_proj, k_proj, v_proj, o_proj) or all-linear, or set "
                        "method.lora_experts: true with method.lora_dropout: 0", field="method.target_modules")
    return names, [name for name, _ in experts] if method.lora_experts else []


def _renamed_by_peft(model, names: list[str]) -> set[str]:
    """Names PEFT's v4→v5 MoE conversion would turn into expert targets (a dense or shared-expert layer named
    like a v4 expert, e.g. ``shared_expert.gate_proj`` of Qwen2-MoE): left out, or PEFT would adapt the experts
    instead (and again whenever the adapter is loaded)."""
    try:
        from peft import LoraConfig
        from peft.utils.transformers_weight_conversion import convert_peft_config_for_transformers
    except ImportError:  # a PEFT without the conversion does not rename anything
        return set()
    probe = LoraConfig(target_modules=list(names))
    convert_peft_config_for_transformers(probe, model=_base(model), conversions=None)
    return set(names) - set(probe.target_modules or ())


def expert_summary(model) -> tuple[str, int]:
    """``(how many experts, in words: "16 experts: 8 per layer in 2 layers"; parameters in their fused weights)``
    of the model ("" and 0: none)."""
    found = fused_experts(model)
    per_module = {name.rsplit(".", 1)[0]: count for name, count in found}
    if not per_module:
        return "", 0
    counts = set(per_module.values())
    words = f"{sum(per_module.values())} experts" + (f": {counts.pop()} per layer in {len(per_module)} layers"
                                                      if len(counts) == 1 and len(per_module) > 1 else "")
    return words, sum(model.get_parameter(name).numel() for name, _ in found)


def part_warnings(cfg, model) -> list[tuple[str, str]]:
    """``(code, message)`` warnings about the parts this run leaves as they are: attention that fell back to eager,
    experts LoRA does not adapt, and experts QLoRA keeps in 16 bits (transformers' bitsandbytes integration quantizes
    ``nn.Linear`` layers only)."""
    out = attention_warnings(cfg, model)
    method = cfg.method
    if method.type == "full":
        return out
    experts, params = expert_summary(model)
    if not experts:
        return out
    left = getattr(_base(model), "tp_not_adapted", [])
    if left:
        out.append(("layers_not_adapted", f"LoRA leaves {len(left)} dense layer(s) frozen whose names PEFT maps to the "
                    f"fused experts of this architecture (first: {', '.join(left[:3])})"))
    if not method.lora_experts:
        out.append(("experts_not_adapted", f"LoRA adapts attention and dense layers; the experts' weights "
                    f"({experts}, {params:,} parameters) stay frozen (set method.lora_experts: true with "
                    f"method.lora_dropout: 0 to adapt them)"))
    if method.type == "qlora":
        out.append(("experts_not_quantized", f"QLoRA keeps the experts' fused weights ({experts}, {params:,} "
                    f"parameters) in 16 bits: transformers' bitsandbytes integration quantizes nn.Linear layers "
                    f"only (attention, dense layers); plan memory for them at 2 bytes per parameter"))
    return out


def attention_warnings(cfg, model) -> list[tuple[str, str]]:
    """An ``eager_attention`` warning when the model runs eager attention although the config asked for a fused
    kernel: transformers has no SDPA path for some architectures (Gemma 2's soft-capped scores, gpt-oss's attention
    sinks), and eager attention holds ``heads × s²`` scores per layer in backward — at long sequences the largest
    term of the plan."""
    conf = _base(model).config
    used = getattr(conf.get_text_config() if hasattr(conf, "get_text_config") else conf, "_attn_implementation", None)
    if used != "eager" or cfg.model.attn_implementation == "eager":
        return []
    return [("eager_attention", f"{type(_base(model)).__name__} runs eager attention: transformers has no "
             f"{cfg.model.attn_implementation} path for this architecture, so each layer keeps heads × sequence² "
             f"attention scores (at data.seq_len {cfg.data.seq_len}: the plan counts them); model.attn_implementation: "
             f"flash_attention_2 keeps attention memory linear in the sequence where flash-attn is installed")]


def processor_files(folder: Path) -> list[Path]:
    """The processor files (image/video preprocessor, processor config) in a local model folder."""
    return [folder / name for name in PROCESSOR_FILES if (folder / name).is_file()]


def companion_files(cfg, model) -> list[Path]:
    """Files of the base model that go beside every model the run saves (final/, checkpoints): a multimodal
    model's processor files, and ``tokenizer.model`` of a SentencePiece tokenizer (a fast tokenizer's
    ``save_pretrained`` does not write it, and llama.cpp's converter reads Gemma's, Llama 2's, Mistral's and
    Phi-3's vocabulary from it)."""
    found = _source_files(cfg, cfg.model.source, PROCESSOR_FILES) if tower_prefixes(model) else []
    src = tokenizer_source(cfg)
    if src not in (None, "demo", "corpus"):
        found += _source_files(cfg, src, ("tokenizer.model",))
    return found


def _source_files(cfg, source: str, names: tuple[str, ...]) -> list[Path]:
    """``names`` that the model or tokenizer ``source`` has: from a local folder, or fetched from the hub (the
    run's revision and token) beside the weights."""
    m = cfg.model
    if not source or m.architecture:
        return []
    if is_local(source):
        folder = Path(source).expanduser()
        return [folder / name for name in names if (folder / name).is_file()]
    from transformers.utils import cached_file

    found = []
    for name in names:
        path = cached_file(source, name, revision=m.revision, token=secrets.hub_token(cfg),
                           _raise_exceptions_for_missing_entries=False, _raise_exceptions_for_connection_errors=False)
        if path:
            found.append(Path(path))
    return found


def copy_files(files: list[Path], to: Path) -> None:
    """Copy ``files`` into the folder ``to`` (a saved model: final/, a checkpoint, an export)."""
    for f in files:
        shutil.copyfile(f, Path(to) / f.name)
