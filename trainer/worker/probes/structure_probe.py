"""The structure probe: ``python -m trainer.worker.probes.structure_probe CONFIG_JSON --out RECORD_JSON``.

Builds the model from its ``config.json`` with transformers' own classes on the meta device (no weights, no
download: ``AutoModelForCausalLM``, ``AutoModelForImageTextToText`` for multimodal checkpoints,
``AutoModelForSeq2SeqLM`` for T5) and writes the structure record the planner reads
(``trainer/models/structure.py``): exact parameters (tied weights once), every decoder layer's kind (full or
sliding attention, linear attention, short convolution, mixture of experts) with its Linear shapes by name (LoRA
targets, PEFT's ``all-linear``: every Linear/Conv1D but the output head), the fused 3-D expert parameters, the
embedding and head, the towers a text run does not train (vision/audio encoders and projectors), dtype and
positions, and what each layer kind saves for backward (``saved_bytes``). Exit 2 with one line on stderr when
transformers cannot build the architecture (or its layers are of a kind the planner does not measure).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from trainer.core.errors import EXIT_BAD_INPUT
from trainer.models import vision as vision_geometry
from trainer.models.structure import FORMAT
from trainer.worker.probes import saved_bytes, vision_bytes

UNMEASURED_MIXERS = ("Mamba", "SSM", "Rwkv", "RWKV", "Retention", "XLSTM", "xLSTM")  # state-space/recurrent mixers
LINEAR_ATTENTION = ("gateddeltanet", "linearattention", "lightning", "deltanet")
CONVOLUTION = ("shortconv",)
TOP_K_NAMES = ("num_experts_per_tok", "experts_per_token", "moe_top_k", "num_experts_per_token", "top_k")


class NotPlannable(Exception):
    """The architecture cannot be built or measured here (the message says why and what to do)."""


def load_config(path: Path):
    """(config dict as published, transformers config). NotPlannable when transformers does not know it."""
    from transformers import AutoConfig

    raw = json.loads(path.read_text(encoding="utf-8"))
    d = {k: v for k, v in raw.items() if not k.startswith("_")}
    d.pop("quantization_config", None)  # training dequantizes: the 16-bit model is what is planned
    kind = d.pop("model_type", None)
    try:
        return raw, AutoConfig.for_model(kind, **d)
    except (ValueError, KeyError, TypeError) as exc:
        remote = " (its config names its own model code, auto_map; the planner never runs downloaded code)" \
            if raw.get("auto_map") else ""
        raise NotPlannable(f"transformers {_version()} cannot build architecture '{kind or '?'}'{remote}: "
                           f"{str(exc).splitlines()[0][:200]}") from None


def _version() -> str:
    import transformers

    return transformers.__version__


def model_class(cfg):
    """The class a run loads: seq2seq LM for encoder-decoders, image-text-to-text for multimodal checkpoints (when
    transformers maps them there), else the causal LM."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForSeq2SeqLM

    if getattr(cfg, "is_encoder_decoder", False):
        autos = (AutoModelForSeq2SeqLM,)
    elif any(getattr(cfg, k, None) is not None for k in ("vision_config", "audio_config")):
        autos = (AutoModelForImageTextToText, AutoModelForCausalLM)
    else:
        autos = (AutoModelForCausalLM,)
    for auto in autos:
        mapping = auto._model_mapping
        if type(cfg) in mapping:
            return mapping[type(cfg)]
    raise NotPlannable(f"transformers {_version()} has no language-model head for architecture '{cfg.model_type}' "
                       "(not a causal, multimodal or sequence-to-sequence LM)")


def build_meta(cfg, dtype: str = "bfloat16"):
    """The model on the meta device (class resolved first: the lazy auto mapping cannot import under meta)."""
    import torch

    cls = model_class(cfg)
    attn = "sdpa" if getattr(cls, "_supports_sdpa", False) else "eager"
    with torch.device("meta"):
        return cls._from_config(cfg, dtype=getattr(torch, dtype), attn_implementation=attn)


def layer_lists(model):
    """The decoder's layer list (the ModuleList of the text decoder holding the most parameters), and for
    encoder-decoders the encoder's."""
    def biggest(module):
        import torch

        lists = [m for m in module.modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
        return max(lists, key=lambda l: sum(p.numel() for p in l.parameters()))

    decoder = model.get_decoder()
    if getattr(model.config, "is_encoder_decoder", False):
        return biggest(decoder), biggest(model.get_encoder())
    return biggest(decoder), None


def final_norm(decoder, layers):
    """The decoder's last normalisation before the head (after the layer list), or None."""
    after, found = False, None
    for child in decoder.children():
        if child is layers:
            after = True
        elif after and "norm" in type(child).__name__.lower():
            found = child
    return found


def _linear_shapes(module) -> list:
    """[relative name, in, out, has bias] of every nn.Linear and Conv1D inside ``module``, in module order."""
    import torch
    from transformers.pytorch_utils import Conv1D

    out = []
    for name, m in module.named_modules():
        if isinstance(m, torch.nn.Linear):
            out.append([name, m.in_features, m.out_features, m.bias is not None])
        elif isinstance(m, Conv1D):
            out.append([name, m.weight.shape[0], m.weight.shape[1], m.bias is not None])
    return out


def _expert_params(layer) -> dict:
    """{name: shape} of the fused expert parameters (3-D, outside convolutions) in ``layer``."""
    import torch

    out = {}
    for mname, m in layer.named_modules():
        if isinstance(m, torch.nn.modules.conv._ConvNd):
            continue
        for pname, p in m.named_parameters(recurse=False):
            if p.dim() == 3:
                out[".".join(x for x in (mname, pname) if x)] = list(p.shape)
    return out


def layer_type(layer, configured) -> str:
    """full_attention | sliding_attention | linear_attention | conv (+ the config's own names, e.g. chunked)."""
    unmeasured = [type(m).__name__ for m in layer.modules() if any(k in type(m).__name__ for k in UNMEASURED_MIXERS)]
    if unmeasured:
        mixer = unmeasured[0]
        raise NotPlannable(f"its {mixer} layers (a state-space/recurrent mixer) are not among the layer kinds the "
                           "memory estimator measures (attention, sliding-window attention, linear attention, short "
                           "convolution, mixture of experts)")
    classes = [type(m).__name__.lower() for m in layer.modules()]
    if any(any(k in c for k in LINEAR_ATTENTION) for c in classes):
        return "linear_attention"
    if any(any(k in c for k in CONVOLUTION) for c in classes):
        return "conv"
    if isinstance(configured, str) and configured:
        return configured
    windowed = any(getattr(m, "sliding_window", None) for m in layer.modules())
    return "sliding_attention" if windowed else "full_attention"


def describe_layers(layers, text_cfg) -> tuple[list, list]:
    """(kind key per layer, kinds in order of first appearance as record entries)."""
    configured = getattr(text_cfg, "layer_types", None)
    keys, kinds = [], {}
    for i, layer in enumerate(layers):
        ltype = layer_type(layer, configured[i] if isinstance(configured, list) and i < len(configured) else None)
        key = saved_bytes.layer_kind(layer, ltype)
        keys.append(key)
        if key not in kinds:
            kinds[key] = _kind_entry(layer, ltype, text_cfg)
        kinds[key]["layers"].append(i)
    return keys, list(kinds.values())


def _kind_entry(layer, ltype: str, text_cfg) -> dict:
    experts = _expert_params(layer)
    window = max((getattr(m, "sliding_window", None) or 0 for m in layer.modules()), default=0) or None
    if ltype == "sliding_attention" and window is None:
        window = getattr(text_cfg, "sliding_window", None)
    return {"type": ltype, "moe": bool(experts), "window": window if ltype == "sliding_attention" else None,
            "params": sum(p.numel() for p in layer.parameters()), "linears": _linear_shapes(layer),
            "experts": experts, "layers": []}


def _params(module) -> int:
    return sum(p.numel() for p in module.parameters()) if module is not None else 0


def towers(model, decoder) -> list[dict]:
    """Submodules a text run does not train: everything outside the text decoder (and a text encoder), the
    embeddings and the LM head (vision/audio encoders, projectors), by name with their parameters."""
    text = [decoder, model.get_output_embeddings(), model.get_input_embeddings()]
    if getattr(model.config, "is_encoder_decoder", False):
        text.append(model.get_encoder())
    inside = {id(p) for m in text for p in m.parameters()}
    out = []
    for name, child in model.named_children():
        kids = list(child.named_children()) if any(id(p) in inside for p in child.parameters()) else [("", child)]
        for sub, mod in kids:
            own = [p for p in mod.parameters() if id(p) not in inside]
            if own and not any(id(p) in inside for p in mod.parameters()):
                out.append({"name": ".".join(x for x in (name, sub) if x), "params": sum(p.numel() for p in own)})
    return out


def experts_summary(kinds: list, text_cfg) -> dict | None:
    """Total experts per MoE layer, active per token, shared experts and the expert MLP width (None: dense)."""
    moe = [k for k in kinds if k["moe"]]
    if not moe:
        return None
    shapes = next(iter(moe[0]["experts"].values()))
    active = next((getattr(text_cfg, n) for n in TOP_K_NAMES if isinstance(getattr(text_cfg, n, None), int)), None)
    shared = getattr(text_cfg, "n_shared_experts", None) or getattr(text_cfg, "num_shared_experts", None) or \
        (1 if any("shared_expert" in lin[0] for k in moe for lin in k["linears"]) else 0)
    width = getattr(text_cfg, "moe_intermediate_size", None) or getattr(text_cfg, "intermediate_size", None)
    return {"total": int(shapes[0]), "active": active, "shared": int(shared), "intermediate": width,
            "layers": sum(len(k["layers"]) for k in moe)}


def _get(cfg, *names, default=None):
    for n in names:
        v = getattr(cfg, n, None)
        if v is not None:
            return v
    return default


def shape_numbers(text_cfg) -> dict:
    """The config's own numbers the planner's formulas use (hidden, heads, K/V heads, head size, MLP width,
    vocabulary, positions), with transformers' defaults where the config leaves them out."""
    h = int(_get(text_cfg, "hidden_size", "n_embd", "d_model"))
    heads = int(_get(text_cfg, "num_attention_heads", "n_head", "num_heads"))
    return {"hidden": h, "heads": heads, "kv_heads": int(_get(text_cfg, "num_key_value_heads", default=heads)),
            "head_dim": int(_get(text_cfg, "head_dim", "d_kv", default=h // heads)),
            "intermediate": int(_get(text_cfg, "intermediate_size", "n_inner", "d_ff", default=4 * h)),
            "vocab": int(text_cfg.vocab_size),
            "max_positions": int(_get(text_cfg, "max_position_embeddings", "n_positions", default=2048))}


def structure(raw: dict, cfg, model) -> tuple[dict, list, object, object]:
    """The record's structure part; also (kind key per decoder layer, the layer list, the final norm)."""
    text_cfg = cfg.get_text_config(decoder=True)
    layers, encoder_layers = layer_lists(model)
    decoder = model.get_decoder()
    keys, kinds = describe_layers(layers, text_cfg)
    # the decoder's own embeddings (tokens, and positions where learned): not the relative-position biases inside
    # layers (T5), which are layer parameters
    emb = [m for m in decoder.children() if type(m).__name__.endswith("Embedding") and hasattr(m, "weight")]
    head = model.get_output_embeddings()
    tied = head.weight is model.get_input_embeddings().weight
    norm = final_norm(decoder, layers)
    rec = {"model_type": raw.get("model_type"), "class": type(model).__name__, "params": _params(model),
           "tied_embeddings": tied, "embedding_params": sum(m.weight.numel() for m in emb),
           "head_params": 0 if tied else _params(head), "final_norm_params": _params(norm),
           **shape_numbers(text_cfg), "layer_count": len(layers), "kinds": kinds,
           "outside_linears": _outside_linears(decoder, layers), "experts": experts_summary(kinds, text_cfg),
           "towers": towers(model, decoder), "dtype": str(raw.get("torch_dtype") or raw.get("dtype") or ""),
           "rope": _rope(text_cfg), "sdpa": bool(getattr(type(model), "_supports_sdpa", False)),
           "encoder_decoder": encoder_layers is not None}
    if encoder_layers is not None:
        _, enc_kinds = describe_layers(encoder_layers, text_cfg)
        rec["encoder"] = {"layer_count": len(encoder_layers), "kinds": enc_kinds}
    return rec, keys, layers, norm


def _outside_linears(decoder, layers) -> dict:
    """Linears of the text decoder outside its layers (projections before/after the stack), by name."""
    inside = {id(m) for m in layers.modules()}
    return [lin for lin in _linear_shapes(decoder) if id(decoder.get_submodule(lin[0])) not in inside]


def _rope(text_cfg) -> dict:
    params = getattr(text_cfg, "rope_parameters", None) or getattr(text_cfg, "rope_scaling", None) or {}
    if isinstance(params, dict) and all(isinstance(v, dict) for v in params.values()) and params:
        params = next(iter(params.values()))  # per layer type: the first's (Gemma 3: full attention)
    return {k: params.get(k) for k in ("rope_type", "partial_rotary_factor", "factor") if isinstance(params, dict)}


def activations(model, keys: list, layers, norm, rec: dict) -> dict:
    """Measured coefficients per setup (``saved_bytes.measure``), the model trimmed to one layer per kind (in
    place: call it last)."""
    kept, reps = saved_bytes.trim_to_kinds(model, layers, model.config.get_text_config(decoder=True), keys)
    decoder = model.get_decoder()
    head = model.get_output_embeddings()
    names = {n for n, m in model.named_modules() if _is_linear(m) and m is not head and
             any(m is x for x in decoder.modules())}
    sliding = rec["sdpa"] and any(k["type"] == "sliding_attention" for k in rec["kinds"])
    pictures = bool(rec.get("vision")) and rec["sdpa"] and rec["model_type"] in vision_geometry.MASKED_WITH_PICTURES
    out = saved_bytes.measure(model, kept, norm, names, sliding, reps, pictures_masked=pictures)
    return {"attention": "sdpa" if rec["sdpa"] else "eager", "tokens": saved_bytes.TOKENS, **out}


def _is_linear(m) -> bool:
    import torch
    from transformers.pytorch_utils import Conv1D

    return isinstance(m, (torch.nn.Linear, Conv1D))


def probe(config_path: Path, measure: bool = True) -> dict:
    """The structure record for ``config_path``. NotPlannable when it cannot be built or measured."""
    import torch

    started = time.perf_counter()
    raw, cfg = load_config(config_path)
    try:
        model = build_meta(cfg)
    except (ValueError, ImportError, TypeError, AttributeError, RuntimeError, AssertionError, KeyError) as exc:
        raise NotPlannable(f"transformers {_version()} could not build architecture '{raw.get('model_type')}': "
                           f"{str(exc).splitlines()[0][:200]}") from None
    rec, keys, layers, norm = structure(raw, cfg, model)
    rec.update({"format": FORMAT, "transformers": _version(), "torch": torch.__version__.split("+")[0]})
    rec["vision"] = vision_bytes.describe(model, rec["towers"]) if "vision_config" in raw else None
    if measure and not rec["encoder_decoder"]:
        saved_bytes.install_kernels()
        try:
            if rec["vision"]:
                rec["vision"]["activations"] = _vision_activations(cfg, rec)
            rec["activations"] = activations(model, keys, layers, norm, rec)
        except Exception as exc:  # any failure of the model's own forward on fake tensors: say which, plan nothing
            raise NotPlannable(f"transformers builds it, but its training forward could not be measured here "
                               f"({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''})") from None
    rec["seconds"] = round(time.perf_counter() - started, 2)
    return rec


def _vision_activations(cfg, rec: dict) -> dict | None:
    """The vision tower's saved bytes per picture (``vision_bytes.measure``, on a model of its own: it trims and
    materialises the tower), for the families whose pictures the planner counts (``trainer.models.vision``); None
    for the others, or with the reason when the tower's forward fails here (the text model is planned regardless)."""
    if rec["model_type"] not in vision_geometry.FAMILIES:
        return None
    try:
        return vision_bytes.measure(build_meta(cfg), rec["vision"])
    except Exception as exc:  # noqa: BLE001 - any failure of the tower's own code on stand-in inputs: say which
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"}


def main(argv: list[str] | None = None) -> int:
    """Child-process entry: write the record to --out; exit 2 with one line when the model cannot be planned."""
    ap = argparse.ArgumentParser(prog="python -m trainer.worker.probes.structure_probe")
    ap.add_argument("config", type=Path, help="a config.json")
    ap.add_argument("--out", type=Path, required=True, help="where the structure record (JSON) goes")
    ap.add_argument("--no-activations", action="store_true", help="the structure only (no saved-tensor measurement)")
    args = ap.parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        rec = probe(args.config, measure=not args.no_activations)
    except NotPlannable as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_BAD_INPUT
    tmp = args.out.with_name(args.out.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(rec, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, args.out)
    print(f"{rec['class']}: {rec['params']:,} parameters, {len(rec['kinds'])} layer kind(s), {rec['seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
