"""Model architecture facts from a ``config.json``, read off the model itself. No torch.

The numbers come from the architecture's structure record (``trainer/models/structure.py``: built by
transformers' own classes on the meta device, shipped for the architectures in ``trainer/resources/models/``,
cached for the others): exact parameters, every decoder layer's kind and Linear shapes, experts, the towers a
text run does not train, and what each layer kind saves for backward.

Sources of a config, in order: a ``config.json`` path; a local model folder; a name in
``trainer/resources/models/`` (``demo-tiny-llama`` is the bundled demo); a hub id shipped there under its own
name; the Hugging Face cache (``$HF_HUB_CACHE`` or ``$HF_HOME/hub`` or ``~/.cache/huggingface/hub``). Nothing
downloads.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from trainer.core.errors import UserError
from trainer.core.paths import MODELS_DIR, hf_repo_cache
from trainer.models import catalog, structure
from trainer.models.sources import is_local

# Families whose activations, loss and LoRA terms the planner has hand-fitted formulas for (checked against
# autograd; tests/test_memory.py): they plan exactly as before the structure probe. Every other architecture
# uses the coefficients its structure record measured. Qwen 3 is not here although it used to share Llama's
# formula: its per-head q/k norms and its attention width (heads × head_dim = 2 × hidden in Qwen3-0.6B/1.7B) keep
# 27–32% more than that formula says, and the measured coefficients equal autograd (tests/test_structure.py).
FITTED_FAMILIES = frozenset({"llama", "mistral", "qwen2", "gemma", "gemma2", "phi", "stablelm", "gpt2", "t5"})
ENCODER_DECODER = {"t5"}


class ModelSpecNotFound(UserError):
    """No config.json could be found for the model (the planner reports "fits unknown")."""


@dataclass(frozen=True)
class LayerGroup:
    """Decoder layers of one kind: ``type`` full_attention | sliding_attention | linear_attention | conv (+ the
    config's own names), ``count`` layers, ``params`` each, ``linears`` ((name, in, out), …) inside one layer,
    ``experts`` ((name, shape), …) its fused 3-D expert parameters, ``window`` tokens (sliding), ``kind`` its
    index in the structure record."""

    type: str
    count: int
    params: int
    linears: tuple[tuple[str, int, int], ...]
    experts: tuple[tuple[str, tuple[int, ...]], ...] = ()
    window: Optional[int] = None
    kind: int = 0


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
    layer_params: int  # one decoder layer (the most common kind)
    lm_head_params: int  # 0 when tied
    linear_shapes: tuple[tuple[int, int], ...]  # (in, out) of each Linear in one layer (LoRA targets)
    source: str = ""
    # encoder-decoder (T5): ``layers``/``layer_params``/``linear_shapes`` describe the encoder; these the decoder
    decoder_layers: int = 0
    decoder_layer_params: int = 0
    decoder_linear_shapes: tuple[tuple[int, int], ...] = ()
    # from the structure record
    groups: tuple[LayerGroup, ...] = ()  # the decoder's layers by kind (encoder's for T5)
    decoder_groups: tuple[LayerGroup, ...] = ()  # T5's decoder
    outside_linears: tuple[tuple[str, int, int], ...] = ()  # text Linears outside the layers (not the head)
    frozen_params: int = 0  # towers a text run does not train (vision/audio encoders, projectors)
    experts: Optional[dict] = None  # total, active (per token), shared, intermediate, layers
    activations: Optional[dict] = None  # measured saved-tensor coefficients (structure record)
    vision: Optional[dict] = None  # vision-language models: tower, projector, what a picture saves (structure record)
    supports_sdpa: bool = True
    kernels: tuple[str, ...] = ()  # optional CUDA kernels that replace a measured reference implementation
    origin: str = ""  # shipped | cache | probe: where the structure record came from
    probe_seconds: float = 0.0  # the probe child's wall time when origin is 'probe'
    router_aux_loss: bool = False  # a MoE config with output_router_logits: true (its router's auxiliary loss)

    @property
    def encoder_decoder(self) -> bool:
        """True for encoder-decoder models (T5): input goes to the encoder, the target to the decoder."""
        return self.decoder_layers > 0

    @property
    def fitted(self) -> bool:
        """True for the families with hand-fitted activation formulas (``FITTED_FAMILIES``)."""
        return self.family in FITTED_FAMILIES

    @property
    def kv_width(self) -> int:
        """Width of the K (or V) projection output: kv_heads × head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def trainable_params(self) -> int:
        """Parameters a full fine-tune on text trains: all but the frozen towers."""
        return self.params - self.frozen_params

    @property
    def attention_layers(self) -> int:
        """Decoder layers that keep a K/V cache (attention, full or sliding); linear-attention and convolution
        layers keep a fixed-size state instead."""
        if not self.groups:
            return self.layers
        return sum(g.count for g in self.groups if "attention" in g.type and g.type != "linear_attention")

    @property
    def typical_linears(self) -> tuple[tuple[str, int, int], ...]:
        """(name, in, out) of the Linears of the most common layer kind (the one ``linear_shapes`` describes)."""
        if not self.groups:
            return tuple((f"linear{i}", i_, o) for i, (i_, o) in enumerate(self.linear_shapes))
        return max(reversed(self.groups), key=lambda g: g.count).linears

    @property
    def largest_layer_params(self) -> int:
        """Largest single module (DeepSpeed ZeRO-3 gathers one at a time): embedding or lm_head here."""
        experts = [_numel(shape) for g in self.groups for _, shape in g.experts]
        return max(self.vocab * self.hidden, max(i * o for i, o in self.linear_shapes), *experts)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def spec_from_config(cfg: dict, name: str = "", source: str = "") -> ModelSpec:
    """The spec of a config.json dict, from its structure record (shipped, cached, or one probe child now).
    ArchitectureUnknown (a UserError) when transformers cannot build it here or its layers are of a kind the
    planner does not measure."""
    fitted = str(cfg.get("model_type") or "").lower() in FITTED_FAMILIES  # their formulas need no measurement
    record, origin = structure.record_for(cfg, name, measured=not fitted)
    return spec_from_record(record, cfg, name, source, origin)


def _group(kind: dict, index: int) -> LayerGroup:
    return LayerGroup(kind["type"], len(kind["layers"]), int(kind["params"]),
                      tuple((n, int(i), int(o)) for n, i, o, _ in kind["linears"]),
                      tuple((n, tuple(shape)) for n, shape in kind.get("experts", {}).items()), kind.get("window"), index)


def _stack(kinds: list) -> tuple[tuple[LayerGroup, ...], LayerGroup]:
    """The groups of one layer stack and its most common kind (ties: the later one, e.g. T5's blocks after the
    first, which alone holds the relative position bias)."""
    groups = tuple(_group(k, i) for i, k in enumerate(kinds))
    typical = max(reversed(groups), key=lambda g: g.count)
    return groups, typical


def spec_from_record(rec: dict, cfg: dict, name: str = "", source: str = "", origin: str = "") -> ModelSpec:
    """A ModelSpec from a structure record (``cfg`` is the config.json dict it was made from)."""
    groups, typical = _stack(rec["kinds"])
    enc = {}
    if rec.get("encoder_decoder"):  # T5: the record's decoder stack is the decoder; the encoder's is "encoder"
        dec_groups, dec_typical = groups, typical
        groups, typical = _stack(rec["encoder"]["kinds"])
        enc = dict(decoder_layers=rec["layer_count"], decoder_layer_params=dec_typical.params,
                   decoder_linear_shapes=tuple((i, o) for _, i, o in dec_typical.linears), decoder_groups=dec_groups)
    layers = rec["encoder"]["layer_count"] if rec.get("encoder_decoder") else rec["layer_count"]
    return ModelSpec(
        name, str(cfg.get("model_type") or rec.get("model_type") or "").lower(), int(rec["params"]), layers,
        rec["hidden"], rec["heads"], rec["kv_heads"], rec["head_dim"], _intermediate(rec, typical, cfg),
        rec["vocab"], rec["max_positions"], bool(rec["tied_embeddings"]), int(rec["embedding_params"]),
        typical.params, int(rec["head_params"]), tuple((i, o) for _, i, o in typical.linears), source, **enc,
        groups=groups, outside_linears=tuple((n, int(i), int(o)) for n, i, o, _ in rec.get("outside_linears", [])),
        frozen_params=sum(int(t["params"]) for t in rec.get("towers", [])), experts=rec.get("experts"),
        activations=rec.get("activations"), vision=rec.get("vision"), supports_sdpa=bool(rec.get("sdpa", True)),
        kernels=_kernels(groups), origin=origin,
        probe_seconds=float(rec.get("probe_seconds", 0.0)) if origin == "probe" else 0.0,
        router_aux_loss=any(bool(c.get("output_router_logits")) for c in (cfg, cfg.get("text_config") or {})))


# Optional CUDA kernels transformers uses instead of the reference implementation the probe measured, per layer kind.
KERNELS = {"linear_attention": ("fla", "causal_conv1d"), "conv": ("causal_conv1d",)}


def _kernels(groups) -> tuple[str, ...]:
    return tuple(dict.fromkeys(k for g in groups for k in KERNELS.get(g.type, ())))


def _intermediate(rec: dict, typical: LayerGroup, cfg: dict) -> int:
    """The MLP width the planner's per-token formulas use: the config's for the fitted families (as before); for
    others the width each token goes through — the experts' × active (+ shared) for MoE, else read off the layer
    (the Linear back to hidden with the widest input; some configs state a width the model rounds)."""
    if str(cfg.get("model_type", "")).lower() in FITTED_FAMILIES:
        return int(rec["intermediate"])
    experts = rec.get("experts")
    if experts and experts.get("active") and experts.get("intermediate"):
        return int(experts["intermediate"]) * (int(experts["active"]) + int(experts.get("shared") or 0))
    back = [i for _, i, o in typical.linears if o == rec["hidden"]]
    return max(back) if back else int(rec["intermediate"])


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
        snaps = sorted((hf_repo_cache(source) / "snapshots").glob("*/config.json"), key=lambda f: f.stat().st_mtime)
        if snaps:
            return snaps[-1]
    return None


def needs_probe(source_or_arch: str) -> bool:
    """True when planning this model will first run the structure probe (its config.json is here but no record
    matches it yet): light, for saying so before the seconds it takes. False when there is nothing to probe."""
    path = find_config(source_or_arch)
    try:
        cfg = json.loads(path.read_text(encoding="utf-8")) if path is not None else None
    except (OSError, json.JSONDecodeError):
        return False
    if not isinstance(cfg, dict):
        return False
    try:
        rec, _ = structure.cached_record(cfg, measured=str(cfg.get("model_type") or "").lower() not in FITTED_FAMILIES)
    except structure.ArchitectureUnknown:
        return False
    return rec is None


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


_SPECS: dict = {}  # (path, mtime, name) -> ModelSpec: a plan's alternatives ask for the same model many times
_SPECS_MAX = 64


def _spec_of_file(path: str, mtime_ns: int, name: str) -> ModelSpec:
    """Parsed once per file version. A spec whose record a probe child made now is kept as 'cache' for later asks
    (the probe ran once; only the plan that paid for it says so)."""
    key = (path, mtime_ns, name)
    if key in _SPECS:
        return _SPECS[key]
    try:
        cfg = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}; is it a valid config.json?", path=path) from None
    if not isinstance(cfg, dict):
        raise UserError(f"cannot read {path}: it is not a JSON object; is it a valid config.json?", path=path)
    spec = spec_from_config(cfg, name=name, source=path)
    if len(_SPECS) >= _SPECS_MAX:
        _SPECS.pop(next(iter(_SPECS)))
    _SPECS[key] = dataclasses.replace(spec, origin="cache", probe_seconds=0.0) if spec.origin == "probe" else spec
    return spec


def spec_for_run(cfg) -> ModelSpec:
    """The spec of a RunConfig's model: ``model.architecture`` when set, else ``model.source``."""
    return load_model_spec(cfg.model.architecture or cfg.model.source)
