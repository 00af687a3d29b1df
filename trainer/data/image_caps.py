"""``data.image_max_pixels`` mapped onto each image processor's own knob (light: plain dicts, no transformers).

The one home of that mapping: the worker applies the returned settings to the processor it loads (so the run's
pictures and every saved processor carry the cap), and the planner can read the same settings from the model's
``preprocessor_config.json`` to count the image tokens a capped picture makes. Three kinds of processor:

- **pixels** (Qwen2-VL, Qwen2.5-VL, Qwen3-VL: ``size.longest_edge`` is a pixel count, ``max_pixels`` in older
  files): the cap is that pixel count (never raised above the processor's own);
- **tiles** (Idefics3, SmolVLM: a picture is resized to ``size.longest_edge`` and cut into square tiles of
  ``max_image_size.longest_edge``, plus one global tile): the cap becomes the longest edge, a whole number of tiles
  whose square holds at most the cap's pixels (at least one tile);
- **fixed** (CLIP/LLaVA, SigLIP/Gemma 3, ...: every picture is resized to the vision tower's one input size): nothing
  to cap; the words say what a picture costs instead.
"""
from __future__ import annotations

import math

TILE_TYPES = ("Idefics3", "SmolVLM")
PIXEL_TYPES = ("Qwen2VL", "Qwen2_5_VL", "Qwen3VL", "Glm4v")


def kind(pre: dict) -> str:
    """``pixels``, ``tiles`` or ``fixed``: how the image processor of ``pre`` (its saved config) sizes a picture."""
    name = str(pre.get("image_processor_type") or "")
    if name.startswith(TILE_TYPES) or "max_image_size" in pre:
        return "tiles"
    size = pre.get("size") or {}
    if name.startswith(PIXEL_TYPES) or "max_pixels" in pre or (
            isinstance(size, dict) and "shortest_edge" in size and "longest_edge" in size
            and (size.get("longest_edge") or 0) > 100_000):
        return "pixels"
    return "fixed"


def capped(pre: dict, max_pixels: int | None) -> tuple[dict, str]:
    """``(settings, words)``: the image-processor settings that cap a picture at ``max_pixels`` (width × height;
    ``{}`` when nothing changes) and one sentence saying what the cap means for this processor."""
    what = kind(pre)
    size = dict(pre.get("size") or {})
    if what == "pixels":
        own = size.get("longest_edge") or pre.get("max_pixels")
        if max_pixels is None:
            return {}, f"pictures are resized to at most {own:,} pixels (the processor's max_pixels)"
        cap = min(int(max_pixels), int(own)) if own else int(max_pixels)
        low = size.get("shortest_edge") or pre.get("min_pixels") or 56 * 56
        return ({"size": {**size, "shortest_edge": min(int(low), cap), "longest_edge": cap}},
                f"pictures are resized to at most {cap:,} pixels (data.image_max_pixels → the processor's max_pixels)")
    if what == "tiles":
        tile = int((pre.get("max_image_size") or {}).get("longest_edge") or 364)
        own = int(size.get("longest_edge") or 4 * tile)
        if max_pixels is None:
            return {}, (f"pictures are resized to a longest edge of {own} pixels and cut into {tile}-pixel tiles "
                        f"(plus one whole-picture tile)")
        edge = max(tile, min(own, math.isqrt(int(max_pixels)) // tile * tile))
        return ({"size": {**size, "longest_edge": edge}},
                f"pictures are resized to a longest edge of {edge} pixels (data.image_max_pixels → the processor's "
                f"longest_edge, in whole {tile}-pixel tiles; at most {math.ceil(edge / tile) ** 2 + 1} tiles)")
    height, width = _fixed_size(pre)
    fixed = f"{width}×{height}" if height and width else "one fixed size"
    if max_pixels is not None and height and width and height * width > max_pixels:
        return {}, (f"every picture is resized to {fixed} pixels, the vision tower's input size: data.image_max_pixels "
                    f"({max_pixels:,}) cannot make it smaller")
    return {}, f"every picture is resized to {fixed} pixels (the vision tower's input size)"


def _fixed_size(pre: dict) -> tuple[int | None, int | None]:
    for key in ("crop_size", "size"):
        value = pre.get(key)
        if isinstance(value, dict) and value.get("height") and value.get("width"):
            return int(value["height"]), int(value["width"])
        if isinstance(value, dict) and value.get("shortest_edge") and pre.get("do_center_crop") is not False:
            edge = int(value["shortest_edge"])
            return edge, edge
        if isinstance(value, int):
            return value, value
    return None, None
