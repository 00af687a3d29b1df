"""What a picture is to a vision-language model: how many tokens it puts in the sequence and how many positions its
vision tower runs over, from the model's own image-processor settings. Light: no torch, no Pillow.

The settings are read, in order, from the ``preprocessor_config.json`` and ``processor_config.json`` beside the
model's ``config.json`` (a local folder, a downloaded hub snapshot), from the shipped record of a catalog model
(``trainer/resources/models/processors/<architecture>.json``: the hub model's published files), else from
transformers' own class defaults for the family. Three kinds of processor, mirrored from transformers 5.23
(each checked against the processor's own ``get_number_of_image_patches`` / ``_get_num_multimodal_tokens`` in
tests/test_vision_geometry.py):

- ``dynamic`` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): the picture keeps its aspect, resized so both sides are multiples of
  patch × merge and its pixels lie in [min_pixels, max_pixels] (``smart_resize``); one token per merge² patches.
- ``tiles`` (Idefics3, SmolVLM): the longest edge is resized to ``size.longest_edge``, cut into tiles of the vision
  encoder's size plus one global view, each tile ``image_seq_len`` tokens after pixel shuffle, with row/column marker
  tokens around them.
- ``fixed`` (Gemma 3 without pan-and-scan, LLaVA): every picture is resized to one size: a fixed number of tokens.

The one vocabulary of picture geometry: the planner reads a model's settings by its family (``model_type``: the
processor files may be absent), the worker reads the processor it loaded by its ``image_processor_type``
(``from_processor_config``); both come out as a ``Processor`` of one of the three kinds, with the same defaults.
``data.image_max_pixels`` is applied to a ``Processor`` by ``trainer.models.image_caps`` for both, so the plan counts
the pictures the run makes.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from trainer.core.paths import PROCESSORS_DIR

# The families (config.json ``model_type``) whose pictures are counted, by kind
DYNAMIC = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
TILES = ("idefics3", "smolvlm")
FIXED = ("gemma3", "llava")
FAMILIES = DYNAMIC + TILES + FIXED
# The image processors (``image_processor_type`` prefixes) of the dynamic and tiled kinds; any other is fixed-size
DYNAMIC_PROCESSORS = ("Qwen2VL", "Qwen2_5_VL", "Qwen3VL", "Glm4v")
TILE_PROCESSORS = ("Idefics3", "SmolVLM")
# Families whose image tokens attend to each other both ways (token_type_ids): with pictures every text layer gets an
# explicit mask, which SDPA converts and saves per layer (the structure probe measures it as the 'pictures' regime)
MASKED_WITH_PICTURES = ("gemma3", "paligemma")

# transformers' defaults where a processor's files leave a setting out (pixels; a patch side in pixels)
PATCH = 14
MIN_PIXELS = 56 * 56  # dynamic: Qwen2-VL's min_pixels
MAX_PIXELS = 28 * 28 * 1280  # dynamic: Qwen2-VL's max_pixels
TILE = 364  # tiles: Idefics3's vision encoder size (max_image_size.longest_edge)
MAX_IMAGE_SIZE = 4096  # transformers' Idefics3/SmolVLM absolute cap on a picture's edge (pixels)


@dataclass(frozen=True)
class Processor:
    """The image processor's settings that decide what a picture costs. Sizes in pixels, counts in tokens."""

    family: str
    kind: str  # dynamic | tiles | fixed
    patch: int  # pixels per patch side
    merge: int = 1  # dynamic: patches merged into one token per side (tokens = patches / merge²)
    min_pixels: int = 0  # dynamic
    max_pixels: int = 0  # dynamic
    longest_edge: int = 0  # tiles: a picture's longest edge after resizing
    tile: int = 0  # tiles: tile side; fixed: the picture's side (its height; 0: not known)
    tile_width: int = 0  # fixed: the picture's width where it is not ``tile`` (0: square)
    splitting: bool = True  # tiles: cut into tiles (else one tile per picture)
    tile_tokens: int = 0  # tiles: image_seq_len per tile; fixed: tokens per picture
    positions: int = 0  # tiles / fixed: positions the vision tower runs over per tile / picture
    source: str = ""  # where the settings were read, in words
    cap: Optional[int] = None  # data.image_max_pixels applied (``image_caps.capped``), or None
    cap_words: str = ""  # what the cap does to these pictures (``image_caps``' words), '' without one

    @property
    def factor(self) -> int:
        """dynamic: the pixel multiple both sides are resized to (patch × merge)."""
        return self.patch * self.merge


@dataclass(frozen=True)
class Picture:
    """One picture as the model sees it: ``tokens`` it puts in the text sequence (placeholders and the markers the
    processor writes around them), ``units`` the vision tower runs (tiles, or 1), each over ``positions`` positions
    (patches)."""

    tokens: int
    units: int
    positions: int


# -- reading the settings -----------------------------------------------------------------------------------------
def is_vision_language(model_cfg: dict) -> bool:
    """Whether a config.json describes a model that takes pictures (has a vision tower)."""
    return isinstance(model_cfg.get("vision_config"), dict)


def read_json(path: Path) -> dict:
    """A JSON object file as a dict; {} when it is missing, unreadable or not an object."""
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}


def processor_files(folder: Optional[Path]) -> tuple[dict, dict, str]:
    """(preprocessor_config.json, processor_config.json, source words) of a model folder; empty when absent."""
    if folder is None:
        return {}, {}, ""
    pre, proc = read_json(folder / "preprocessor_config.json"), read_json(folder / "processor_config.json")
    return pre, proc, (f"{folder}'s preprocessor_config.json" if pre or proc else "")


def shipped_files(architecture: Optional[str]) -> tuple[dict, dict, str]:
    """The shipped record of a catalog model's published processor files (``{"preprocessor": …, "processor": …}``)."""
    if not architecture:
        return {}, {}, ""
    d = read_json(PROCESSORS_DIR / f"{architecture}.json")
    if not d:
        return {}, {}, ""
    return d.get("preprocessor") or {}, d.get("processor") or {}, f"the published processor of {d.get('hub_id', architecture)}"


def kind_of_family(family: str) -> Optional[str]:
    """``dynamic``, ``tiles`` or ``fixed`` for a counted family (config.json ``model_type``); None for the others."""
    for kind, families in (("dynamic", DYNAMIC), ("tiles", TILES), ("fixed", FIXED)):
        if family in families:
            return kind
    return None


def kind_of_processor(pre: dict) -> str:
    """``dynamic``, ``tiles`` or ``fixed``: how the image processor of ``pre`` (its saved config, ``to_dict()``)
    sizes a picture: by its ``image_processor_type``, else by the settings only that kind has (Idefics3's
    ``max_image_size``; Qwen's ``max_pixels``, or a ``size`` whose longest edge is a pixel count)."""
    name = str(pre.get("image_processor_type") or "")
    if name.startswith(TILE_PROCESSORS) or "max_image_size" in pre:
        return "tiles"
    size = pre.get("size") or {}
    if name.startswith(DYNAMIC_PROCESSORS) or "max_pixels" in pre or (
            isinstance(size, dict) and "shortest_edge" in size and "longest_edge" in size
            and (size.get("longest_edge") or 0) > 100_000):
        return "dynamic"
    return "fixed"


def settings(model_cfg: dict, pre: dict, proc: dict, source: str = "") -> Optional[Processor]:
    """The picture settings of a vision-language config.json, from its processor files (``pre``: preprocessor_config,
    ``proc``: processor_config; empty: transformers' defaults for the family). None for a model that takes no
    pictures or a family whose pictures TrainPilot does not count."""
    family = str(model_cfg.get("model_type") or "").lower()
    kind = kind_of_family(family)
    if not is_vision_language(model_cfg) or kind is None:
        return None
    vision = model_cfg["vision_config"]
    source = source or "transformers' defaults for the family (no preprocessor_config.json found)"
    merged = {**pre, **proc}
    if kind == "dynamic":
        return _dynamic(family, vision, merged, source)
    if kind == "tiles":
        return _tiles(family, model_cfg, vision, merged, source)
    return _fixed(family, model_cfg, vision, merged, source)


def from_processor_config(pre: dict, source: str = "") -> Processor:
    """The settings of an image processor the worker loaded (``pre``: its ``to_dict()``), read as the planner reads
    the same files (its kind by ``kind_of_processor``; no config.json: the vision tower's own numbers are the
    defaults). A fixed-size processor whose size it does not name has ``tile`` 0."""
    family = str(pre.get("image_processor_type") or "")
    kind = kind_of_processor(pre)
    if kind == "dynamic":
        return _dynamic(family, {}, pre, source)
    if kind == "tiles":
        return _tiles(family, {}, {}, pre, source)
    height, width = fixed_size(pre) or (0, 0)
    return Processor(family, "fixed", PATCH, tile=height, tile_width=width if width != height else 0, source=source)


def _size(d: dict, key: str) -> Optional[int]:
    size = d.get("size")
    value = size.get(key) if isinstance(size, dict) else None
    return int(value) if isinstance(value, (int, float)) and value else None


def fixed_size(d: dict) -> Optional[tuple[int, int]]:
    """(height, width) in pixels every picture is resized to by a fixed-size processor's settings: its crop, else its
    size (a shortest edge is the side only when the picture is then cropped square); None when they name none."""
    for key in ("crop_size", "size"):
        value = d.get(key)
        if isinstance(value, dict) and value.get("height") and value.get("width"):
            return int(value["height"]), int(value["width"])
        if isinstance(value, dict) and value.get("shortest_edge") and d.get("do_center_crop") is not False:
            edge = int(value["shortest_edge"])
            return edge, edge
        if isinstance(value, int):
            return value, value
    return None


def _dynamic(family: str, vision: dict, d: dict, source: str) -> Processor:
    patch = int(d.get("patch_size") or vision.get("patch_size") or PATCH)
    merge = int(d.get("merge_size") or vision.get("spatial_merge_size") or 2)
    low = _size(d, "shortest_edge") or int(d.get("min_pixels") or MIN_PIXELS)
    high = _size(d, "longest_edge") or int(d.get("max_pixels") or MAX_PIXELS)
    return Processor(family, "dynamic", patch, merge, min_pixels=low, max_pixels=high, source=source)


def _tiles(family: str, model_cfg: dict, vision: dict, d: dict, source: str) -> Processor:
    patch = int(vision.get("patch_size") or PATCH)
    tile_cfg = d.get("max_image_size")
    tile = int(tile_cfg.get("longest_edge")) if isinstance(tile_cfg, dict) and tile_cfg.get("longest_edge") else \
        int(vision.get("image_size") or TILE)
    longest = _size(d, "longest_edge") or 4 * tile
    scale = int(model_cfg.get("scale_factor") or 2)
    seq = int(d.get("image_seq_len") or ((tile // patch) ** 2) // (scale * scale))
    split = d.get("do_image_splitting")
    return Processor(family, "tiles", patch, longest_edge=longest, tile=tile, splitting=True if split is None else
                     bool(split), tile_tokens=seq, positions=(tile // patch) ** 2, source=source)


def _fixed(family: str, model_cfg: dict, vision: dict, d: dict, source: str) -> Processor:
    patch = int(vision.get("patch_size") or PATCH)
    size = fixed_size(d)
    if family == "gemma3":  # one 896² view per picture: pan-and-scan is kept off (its crops would add pictures)
        side = size[0] if size else int(vision.get("image_size") or 896)
        tokens = int(d.get("image_seq_length") or model_cfg.get("mm_tokens_per_image") or 256)
        return Processor(family, "fixed", patch, tile=side, tile_tokens=tokens, positions=(side // patch) ** 2,
                         source=source)
    side = size[0] if size else int(vision.get("image_size") or 336)
    patch = int(d.get("patch_size") or patch)
    extra = int(d.get("num_additional_image_tokens", 1))
    strategy = d.get("vision_feature_select_strategy") or model_cfg.get("vision_feature_select_strategy") or "default"
    grid = (side // patch) ** 2
    return Processor(family, "fixed", patch, tile=side, tile_tokens=grid + extra - (1 if strategy == "default" else 0),
                     positions=grid + 1, source=source)


def for_model(model_cfg: dict, folder: Optional[Path] = None, architecture: Optional[str] = None) -> Optional[Processor]:
    """The picture settings of a model: its folder's processor files, else the shipped record of its catalog
    architecture, else the family's defaults (``settings``)."""
    for pre, proc, source in (processor_files(folder), shipped_files(architecture)):
        if pre or proc:
            return settings(model_cfg, pre, proc, source)
    return settings(model_cfg, {}, {})


# -- a picture's tokens and positions -----------------------------------------------------------------------------
def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's resize (transformers' ``smart_resize``): both sides multiples of ``factor``, pixels within
    [min_pixels, max_pixels], the aspect kept as closely as possible."""
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _rescale_to_max_len(height: int, width: int, max_len: int) -> tuple[int, int]:
    """Idefics3's resize of the longest edge to ``max_len`` (the other side even), then under MAX_IMAGE_SIZE."""
    aspect = width / height
    if width >= height:
        width, height = max_len, int(max_len / aspect)
        height += height % 2
    else:
        height, width = max_len, int(max_len * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > MAX_IMAGE_SIZE:
        width, height = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE / aspect)
    elif height > width and height > MAX_IMAGE_SIZE:
        height, width = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE * aspect)
    return max(height, 1), max(width, 1)


def tile_grid(p: Processor, height: int, width: int) -> tuple[int, int]:
    """(rows, columns) of tiles an Idefics3/SmolVLM picture is cut into; (0, 0): one tile, not split."""
    if not p.splitting:
        return 0, 0
    height, width = _rescale_to_max_len(height, width, p.longest_edge)
    rows, cols = math.ceil(height / p.tile), math.ceil(width / p.tile)
    return (rows, cols) if rows * p.tile > p.tile or cols * p.tile > p.tile else (0, 0)


def picture(p: Processor, width: int, height: int) -> Picture:
    """A ``width`` × ``height`` pixel picture as the model sees it."""
    if p.kind == "dynamic":
        h, w = smart_resize(height, width, p.factor, p.min_pixels, p.max_pixels)
        patches = (h // p.patch) * (w // p.patch)
        return Picture(patches // (p.merge * p.merge), 1, patches)
    if p.kind == "tiles":
        return _tiled(p, *tile_grid(p, height, width))
    return Picture(p.tile_tokens, 1, p.positions)


def _tiled(p: Processor, rows: int, cols: int) -> Picture:
    """Tokens of a picture cut into rows × cols tiles plus its global view (transformers' Idefics3 count: each tile
    its tokens, a marker and a row/column token; a newline per row; the global view with its two markers and its
    token), or a lone tile."""
    base = p.tile_tokens + 3
    if not rows:
        return Picture(base, 1, p.positions)
    return Picture(base + rows * ((p.tile_tokens + 2) * cols + 1), rows * cols + 1, p.positions)


def largest(p: Processor) -> Picture:
    """The most a picture can cost with these settings: Qwen at max_pixels (at most max_pixels / (patch·merge)²
    tokens), Idefics3 a square picture cut into the most tiles, a fixed-size processor its one size."""
    if p.kind == "dynamic":
        tokens = p.max_pixels // (p.factor * p.factor)
        return Picture(tokens, 1, tokens * p.merge * p.merge)
    if p.kind == "tiles":
        return picture(p, p.longest_edge, p.longest_edge)
    return Picture(p.tile_tokens, 1, p.positions)


def describe(p: Processor) -> str:
    """The settings in words (for the plan's reasons)."""
    if p.kind == "dynamic":
        return (f"{p.patch}-px patches merged {p.merge}×{p.merge} per token, {p.min_pixels:,}–{p.max_pixels:,} pixels "
                f"per picture")
    if p.kind == "tiles":
        split = f"cut into {p.tile}-px tiles plus a global view" if p.splitting else f"one {p.tile}-px tile"
        return f"longest edge {p.longest_edge} px, {split}, {p.tile_tokens} tokens per tile"
    return f"every picture {p.tile}×{p.tile} px, {p.tile_tokens} tokens"
