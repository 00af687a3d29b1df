"""What pictures cost a vision-language run, for the memory model (bytes, tokens). No torch.

A picture costs three things:

1. **Tokens in the text sequence**: its image tokens (and the markers the processor writes around them) run through
   every decoder layer like text. Where the data's statistics are cached (``trainer.data.token_stats``: what
   ``trainpilot-cli data`` measured with the model's own processor) the planned sequence is the data's longest sample,
   pictures included; the sample with the most pictures and the most tokens a picture gave come from there too.
   Without them a picture is planned at the most its processor can make of it (``trainer.models.vision.largest``,
   ``data.image_max_pixels`` applied), one picture per sample unless the data's scan counted more.
2. **The vision tower's activations**: what the tower and projector save for backward, measured per picture (tile) by
   the structure probe (``trainer/worker/probes/vision_bytes.py``) for each ``method.train_vision``: nothing when they
   are frozen (the default), the projector's input when it trains, every block when the tower trains (checkpointed
   like the text layers when checkpointing is on; LoRA's adapters on the tower add their own inputs). A frozen
   tower's forward still works over all of a micro-batch's pictures at once: its working memory (at most what one
   block would save, ``vision_forward``) counts where it exceeds the step's later peak.
3. **Trained vision weights**: ``train_vision: projector`` trains the projector's weights, ``all`` also the tower's
   (a full fine-tune: fully; LoRA/QLoRA: adapters on the tower's block Linears, the projector in full), each with
   gradients and optimizer states.

Gemma 3's image tokens attend to each other both ways: with pictures every text layer gets an explicit mask, which
SDPA keeps per layer (the probe's 'pictures' coefficients).
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from trainer.core.paths import MODELS_DIR
from trainer.data import scan, token_stats
from trainer.models import image_caps, vision
from trainer.models.vision import MASKED_WITH_PICTURES
from trainer.models.spec import ModelSpec
from trainer.planning import adapters, saver_memory


@dataclass(frozen=True)
class PictureLoad:
    """The pictures one sample brings, as planned: ``per_sample`` pictures (the sample with the most), each as
    ``picture`` (the costliest: tokens, vision units and positions), from the data's statistics or the processor's
    largest picture; ``words`` says which."""

    processor: vision.Processor
    per_sample: int
    picture: vision.Picture
    measured: bool
    words: str


@functools.lru_cache(maxsize=64)
def _processor(source: str, stamp: int) -> Optional[vision.Processor]:
    try:
        cfg = json.loads(Path(source).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    path = Path(source)
    architecture = path.stem if path.parent == MODELS_DIR else None
    return vision.for_model(cfg, None if architecture else path.parent, architecture)


def processor_of(spec: ModelSpec) -> Optional[vision.Processor]:
    """The picture settings of ``spec``'s model (its folder's processor files, a catalog model's shipped record, or
    the family's defaults); None for a model that takes no pictures or whose pictures are not counted."""
    if not spec.vision or not spec.source:
        return None
    try:
        stamp = Path(spec.source).stat().st_mtime_ns
    except OSError:
        return None
    return _processor(spec.source, stamp)


def measured_activations(spec: ModelSpec) -> bool:
    """Whether the structure record measured what the tower saves per picture."""
    acts = (spec.vision or {}).get("activations")
    return bool(acts) and "setups" in acts


def load(cfg, spec: Optional[ModelSpec], stats: Optional[dict], counted: Optional[int]) -> Optional[PictureLoad]:
    """The pictures ``cfg``'s samples bring to ``spec``'s model: ``stats`` the data's cached token statistics (their
    ``pictures`` part), ``counted`` the most pictures in one record by the data's cached scan (None: not scanned).
    None when the model takes no pictures or the data has none."""
    p = processor_of(spec) if spec is not None else None
    if p is None:
        return None
    p = capped(p, cfg.data.image_max_pixels)
    seen = (stats or {}).get("pictures") or {}
    per = seen.get("max_per_record", counted)
    if per == 0:
        return None
    if seen.get("image_tokens_per_picture") or seen.get("image_tokens_max_per_sample"):
        return _measured(p, int(per or 1), seen)
    pic = vision.largest(p)
    how = f"{per} per sample (the data's most)" if per else "one per sample (the data's pictures are not counted yet: " \
        "'trainpilot-cli data' counts them)"
    return PictureLoad(p, int(per or 1), pic, False, f"pictures planned at the most the processor makes of one, "
                       f"{pic.tokens:,} tokens ({vision.describe(p)}), {how}")


def _measured(p: vision.Processor, per: int, seen: dict) -> PictureLoad:
    """The data report's picture tokens (``trainpilot-cli data``, the model's own processor): every picture's tokens
    when they are all alike, else the most one sample's pictures take, spread over its pictures (the tower's cost is
    its positions in all, so the sample's total is what counts)."""
    same = seen.get("image_tokens_per_picture")
    tokens = int(same) if same else math.ceil(int(seen["image_tokens_max_per_sample"]) / per)
    pic = from_tokens(p, tokens)
    each = f"each {tokens:,} tokens" if same else f"{int(seen['image_tokens_max_per_sample']):,} image tokens in all"
    return PictureLoad(p, per, pic, True, f"the data's sample with the most pictures has {per}, {each} (measured "
                       f"with the model's processor)")


def load_for(cfg, spec: Optional[ModelSpec]) -> Optional[PictureLoad]:
    """``load`` with what is cached about ``cfg``'s data: its token statistics, else its scan's picture count (the
    planner never reads the records itself)."""
    if spec is None or processor_of(spec) is None:
        return None
    stats = token_stats.load(cfg)
    counted = None
    if not (stats or {}).get("pictures") and not cfg.data.hub_dataset:
        found = scan.cached(cfg.data.path, cfg.data)
        counted = found.pictures.get("max_per_record") if found is not None and found.pictures else None
    return load(cfg, spec, stats, counted)


def capped(p: vision.Processor, max_pixels: Optional[int]) -> vision.Processor:
    """The settings with ``data.image_max_pixels`` applied as the worker applies it to the processor
    (``trainer.models.image_caps``, the one home of that mapping: Qwen's max_pixels, Idefics3/SmolVLM's longest edge
    in whole tiles; a fixed-size processor unchanged), with its words in ``cap_words``; unchanged without a cap."""
    return image_caps.capped(p, int(max_pixels)) if max_pixels else p


def from_tokens(p: vision.Processor, tokens: int) -> vision.Picture:
    """A picture that gave ``tokens`` tokens, with the vision units and positions that go with them: Qwen's
    positions are its tokens × merge²; an Idefics3 picture's tiles follow from its tokens (each tile its tokens and
    two markers, a newline per row); a fixed-size picture is its one size."""
    if p.kind == "dynamic":
        return vision.Picture(tokens, 1, tokens * p.merge * p.merge)
    if p.kind == "tiles":
        base = p.tile_tokens + 3
        extra = max(0, tokens - base)
        return vision.Picture(tokens, 1 + math.ceil(extra / (p.tile_tokens + 2)) if extra else 1, p.positions)
    return vision.largest(p)


# -- the memory model's terms -------------------------------------------------------------------------------------
def vision_setup(s) -> str:
    """Which of the probe's measured setups a TrainSetup is: frozen, projector, tower or tower_lora."""
    if s.train_vision == "projector":
        return "projector"
    if s.train_vision == "all":
        return "tower" if s.method == "full" else "tower_lora"
    return "frozen"


def vision_grads(s) -> bool:
    """Whether the image features carry gradients into the text model (the projector or the tower trains)."""
    return bool(s.pictures) and s.train_vision in ("projector", "all")


def trainable(spec: ModelSpec, s) -> tuple[int, int]:
    """(vision parameters trained in full, LoRA adapter parameters on the tower) for ``method.train_vision``."""
    v = spec.vision
    if not v or s.train_vision == "none":
        return 0, 0
    if s.train_vision == "projector":
        return int(v["projector_params"]), 0
    if s.method == "full":
        return int(v["projector_params"]) + int(v["tower_params"]), 0
    per_block = sum(s.lora_r * (i + o) for _, i, o, _b in v["block_linears"])
    return int(v["projector_params"]), per_block * int(v["depth"])


def with_trained_vision(spec: ModelSpec, s) -> ModelSpec:
    """``spec`` with a full fine-tune's trained vision parameters no longer frozen (they get gradients and states)."""
    full, _ = trainable(spec, s)
    if not full or s.method != "full":
        return spec
    return replace(spec, frozen_params=max(0, spec.frozen_params - full))


def qlora_vision_bytes_saved(spec: ModelSpec, s) -> int:
    """Bytes QLoRA saves on the vision side against its 16-bit weights: bitsandbytes quantises the vision tower's
    Linears too, and the projector's unless it trains (a 4-bit layer cannot train whole: the worker keeps it 16-bit);
    their NF4 weights with their quantisation state replace 2 bytes per element."""
    v = spec.vision
    if s.method != "qlora" or not v:
        return 0
    linears = [i * o for _, i, o, _b in v["block_linears"]] * int(v["depth"])
    if s.train_vision == "none":
        linears += [i * o for _, i, o, _b in v.get("projector_linears", [])]
    return sum(2 * n - saver_memory.nf4_weight_bytes(n) for n in linears)


def _part(c: list, n: int) -> float:
    const, lin, quad = c
    return const + lin * n + quad * n * n


def _units(s) -> int:
    """Vision units (pictures or tiles) one micro-batch runs: every sample as the one with the most pictures."""
    return s.micro_batch * s.sequences_per_sample * s.pictures * s.picture_units


def activation_bytes(spec: ModelSpec, s) -> int:
    """Bytes the vision tower and projector save for backward over one micro-batch's pictures (a checkpointed
    tower: each block's input; ``recompute_bytes`` is the block rebuilt in backward)."""
    if not s.pictures or not measured_activations(spec) or vision_setup(s) == "frozen":
        return 0
    v, setup = spec.vision, vision_setup(s)
    c, n, units = v["activations"]["setups"][setup], s.picture_positions, _units(s)
    rest = _part(c["rest"], n) + v.get("taps", 0) * _part(c["tap"], n)
    if _checkpointed(s):
        blocks = v["depth"] * n * v["hidden"] * s.activation_width
    else:
        blocks = _part(c["first"], n) + (v["depth"] - 1) * _part(c["layer"], n)
    total = c["shared"] + units * (rest + blocks)
    if setup == "tower_lora" and not _checkpointed(s):  # the adapters' own fp32 inputs (or dropout outputs), middles
        total += units * n * v["depth"] * _adapter_per_position(v, s)
    return int(total * (s.activation_width // 2))  # measured with 16-bit weights


def _checkpointed(s) -> bool:
    """The tower's blocks are checkpointed (HF checkpoints every block of the model, the tower's too)."""
    return s.checkpointing and vision_setup(s) in ("tower", "tower_lora")


def _adapter_per_position(v: dict, s) -> int:
    linears = tuple((name, i, o) for name, i, o, _b in v["block_linears"])
    return adapters.activation_per_token(replace(s, lora_targets=(adapters.ALL_LINEAR,)), linears)


def recompute_bytes(spec: ModelSpec, s) -> int:
    """A checkpointed tower's one block rebuilt in backward, over the micro-batch's pictures (0 otherwise)."""
    if not s.pictures or not measured_activations(spec) or not _checkpointed(s):
        return 0
    v = spec.vision
    c, n = v["activations"]["setups"][vision_setup(s)]["layer"], s.picture_positions
    extra = n * _adapter_per_position(v, s) if vision_setup(s) == "tower_lora" else 0
    return int(_units(s) * (_part(c, n) + extra) * (s.activation_width // 2))


def forward_bytes(spec: ModelSpec, s) -> int:
    """Working memory of a frozen tower's forward over one micro-batch's pictures (no gradients: freed block by
    block): at most what one block would save for backward, for all of them at once."""
    if not s.pictures or not measured_activations(spec) or vision_setup(s) != "frozen":
        return 0
    c = spec.vision["activations"]["setups"]["tower"]["layer"]
    return int(_units(s) * _part(c, s.picture_positions) * (s.activation_width // 2))


def pictures_masked(spec: ModelSpec, s) -> bool:
    """Whether the text layers run with an explicit mask in every layer (Gemma 3 with pictures)."""
    return bool(s.pictures) and spec.family in MASKED_WITH_PICTURES
