"""trainer/models/vision.py (and planning/picture_memory.capped): a picture's tokens and vision positions as the processors compute them (transformers'
PIL image processors' own ``get_number_of_image_patches``, configured with data.image_max_pixels as the worker
configures them: ``trainer.models.image_caps``), and the settings read from processor files."""
from __future__ import annotations

import json

import pytest

from trainer.models import image_caps
from trainer.models import vision
from trainer.planning import picture_memory as pictures

QWEN = {"model_type": "qwen2_5_vl", "vision_config": {"patch_size": 14, "spatial_merge_size": 2}}
QWEN_PRE = {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2}
SMOL = {"model_type": "idefics3", "scale_factor": 4, "vision_config": {"patch_size": 16, "image_size": 512}}
SMOL_PRE = {"size": {"longest_edge": 2048}, "max_image_size": {"longest_edge": 512}, "do_image_splitting": True}
SIZES = [(1, 1), (28, 28), (640, 480), (480, 640), (1000, 700), (1920, 1080), (4000, 3000), (300, 5000), (5000, 40)]


@pytest.mark.slow  # imports transformers' image processors: seconds
def test_qwen_tokens_equal_the_processors_own_count():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    ours = vision.settings(QWEN, QWEN_PRE, {})
    for cap in (None, 1_000_000, 200_000):
        p = pictures.capped(ours, cap)
        base = {k: v for k, v in QWEN_PRE.items() if k not in ("min_pixels", "max_pixels")} if cap else QWEN_PRE
        theirs = Qwen2VLImageProcessorPil(**base, **image_caps.for_processor(QWEN_PRE, cap)[0])
        for w, h in SIZES[1:]:  # a 1-px picture is refused by the processor (aspect, too small)
            patches = theirs.get_number_of_image_patches(h, w, {})
            got = vision.picture(p, w, h)
            assert (got.positions, got.tokens) == (patches, patches // 4), (cap, w, h)
        assert vision.largest(p).tokens >= max(vision.picture(p, w, h).tokens for w, h in SIZES[1:])


@pytest.mark.slow  # imports transformers' image processors: seconds
def test_idefics3_tiles_equal_the_processors_own_count():
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    ours = vision.settings(SMOL, SMOL_PRE, {"image_seq_len": 64})
    for cap in (None, 1_000_000, 300_000, 10):  # 10 pixels: still one whole tile
        p = pictures.capped(ours, cap)
        theirs = Idefics3ImageProcessorPil(**{**SMOL_PRE, **image_caps.for_processor(SMOL_PRE, cap)[0]})
        for w, h in SIZES:
            tiles, rows, cols = theirs.get_number_of_image_patches(h, w, {})
            assert vision.tile_grid(p, h, w) == (rows, cols), (cap, w, h)
            assert vision.picture(p, w, h).units == max(1, tiles)
    assert vision.picture(ours, 2048, 2048) == vision.Picture(64 + 3 + 4 * (66 * 4 + 1), 17, 1024)
    assert pictures.capped(ours, 300_000).longest_edge == 512  # √300,000 = 547 px: one tile across


def test_fixed_size_processors_ignore_the_cap_and_say_so():
    gemma = {"model_type": "gemma3", "mm_tokens_per_image": 256, "vision_config": {"patch_size": 14, "image_size": 896}}
    p = pictures.capped(vision.settings(gemma, {"size": {"height": 896, "width": 896}}, {"image_seq_length": 256}), 10_000)
    assert vision.picture(p, 5000, 100) == vision.Picture(256, 1, 4096)
    assert "cannot make it smaller" in p.cap_words
    llava = {"model_type": "llava", "vision_config": {"patch_size": 14, "image_size": 336}}
    pre = {"crop_size": {"height": 336, "width": 336}}
    assert vision.largest(vision.settings(llava, pre, {"patch_size": 14})) == vision.Picture(576, 1, 577)


def test_settings_come_from_the_folder_then_the_shipped_record_then_defaults(tmp_path):
    assert vision.for_model({"model_type": "llama"}) is None  # no vision tower
    assert vision.for_model({"model_type": "pixtral_x", "vision_config": {}}) is None  # a family not counted
    default = vision.for_model(QWEN, tmp_path)
    assert default.max_pixels == 28 * 28 * 1280 and "defaults" in default.source
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(QWEN_PRE))
    mine = vision.for_model(QWEN, tmp_path)
    assert mine.max_pixels == 12845056 and str(tmp_path) in mine.source
    shipped = vision.for_model(QWEN, None, "qwen2.5-vl-7b")
    assert shipped.max_pixels == 12845056 and "Qwen/Qwen2.5-VL-7B-Instruct" in shipped.source


@pytest.mark.parametrize("cap, tokens", [(None, 16384), (1_003_520, 1280), (200_704, 256)])
def test_qwen_largest_picture(cap, tokens):
    assert vision.largest(pictures.capped(vision.settings(QWEN, QWEN_PRE, {}), cap)).tokens == tokens
