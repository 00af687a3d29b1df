"""``data.image_max_pixels`` mapped onto each image processor's own knob (light: no transformers).

The one home of that mapping, on the one picture vocabulary (``trainer.models.vision.Processor``): the planner caps
the settings it read for a model (``capped``) to count the image tokens a capped picture makes; the worker caps the
processor it loads (``for_processor``: the settings to set on it, so the run's pictures and every saved processor
carry the cap). Three kinds of processor:

- **dynamic** (Qwen2-VL, Qwen2.5-VL, Qwen3-VL: ``size.longest_edge`` is a pixel count, ``max_pixels`` in older
  files): the cap is that pixel count (never raised above the processor's own);
- **tiles** (Idefics3, SmolVLM: a picture is resized to ``size.longest_edge`` and cut into square tiles of
  ``max_image_size.longest_edge``, plus one global tile): the cap becomes the longest edge, a whole number of tiles
  whose square holds at most the cap's pixels (at least one tile);
- **fixed** (CLIP/LLaVA, SigLIP/Gemma 3, ...: every picture is resized to the vision tower's one input size): nothing
  to cap; the words say what a picture costs instead.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional

from trainer.models import vision
from trainer.models.vision import Processor


def capped(p: Processor, max_pixels: Optional[int]) -> Processor:
    """``p`` with a picture capped at ``max_pixels`` (width × height; None: uncapped) and, in ``cap_words``, one
    sentence saying what the cap means for this processor."""
    if p.kind == "dynamic":
        return _dynamic(p, max_pixels)
    if p.kind == "tiles":
        return _tiles(p, max_pixels)
    return replace(p, cap=max_pixels, cap_words=_fixed_words(p, max_pixels))


def for_processor(pre: dict, max_pixels: Optional[int]) -> tuple[dict, str]:
    """``(settings, words)`` for an image processor whose saved config is ``pre`` (its ``to_dict()``): the settings
    that cap a picture at ``max_pixels`` (``{}`` when nothing changes) and ``capped``'s sentence."""
    p = capped(vision.from_processor_config(pre), max_pixels)
    if max_pixels is None or p.kind == "fixed":
        return {}, p.cap_words
    size = dict(pre.get("size") or {})
    if p.kind == "dynamic":
        return {"size": {**size, "shortest_edge": p.min_pixels, "longest_edge": p.max_pixels}}, p.cap_words
    return {"size": {**size, "longest_edge": p.longest_edge}}, p.cap_words


def _dynamic(p: Processor, max_pixels: Optional[int]) -> Processor:
    if max_pixels is None:
        return replace(p, cap_words=f"pictures are resized to at most {p.max_pixels:,} pixels (the processor's "
                                    f"max_pixels)")
    cap = min(int(max_pixels), p.max_pixels)
    return replace(p, min_pixels=min(p.min_pixels, cap), max_pixels=cap, cap=int(max_pixels),
                   cap_words=f"pictures are resized to at most {cap:,} pixels (data.image_max_pixels → the "
                             f"processor's max_pixels)")


def _tiles(p: Processor, max_pixels: Optional[int]) -> Processor:
    tile, own = p.tile, p.longest_edge
    if max_pixels is None:
        return replace(p, cap_words=f"pictures are resized to a longest edge of {own} pixels and cut into {tile}-pixel "
                                    f"tiles (plus one whole-picture tile)")
    edge = max(tile, min(own, math.isqrt(int(max_pixels)) // tile * tile))
    return replace(p, longest_edge=edge, cap=int(max_pixels),
                   cap_words=f"pictures are resized to a longest edge of {edge} pixels (data.image_max_pixels → the "
                             f"processor's longest_edge, in whole {tile}-pixel tiles; at most "
                             f"{math.ceil(edge / tile) ** 2 + 1} tiles)")


def _fixed_words(p: Processor, max_pixels: Optional[int]) -> str:
    height, width = p.tile, p.tile_width or p.tile
    fixed = f"{width}×{height}" if height and width else "one fixed size"
    if max_pixels is not None and height and width and height * width > max_pixels:
        return (f"every picture is resized to {fixed} pixels, the vision tower's input size: data.image_max_pixels "
                f"({max_pixels:,}) cannot make it smaller")
    return f"every picture is resized to {fixed} pixels (the vision tower's input size)"
