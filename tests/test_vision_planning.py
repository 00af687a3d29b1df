"""The plan counts pictures (issue 28 item 3): image tokens per picture from the processor's settings, the sample with
the most pictures from the data's statistics (or its scan), data.image_max_pixels, what method.train_vision trains,
and what the vision tower saves per picture (measured by the structure probe); the slow test holds the plan within
10% of autograd for tiny SmolVLM- and LLaVA-shaped models, whole model, on the CPU."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer import config as C
from trainer.data import scan, token_stats
from trainer.hardware.source import open_probe
from trainer.models import structure, vision
from trainer.models.spec import load_model_spec
from trainer.planning.plan import plan_run

HW = Path(__file__).parent / "fixtures" / "hardware"
DESKTOP = HW / "desktop_24gb.jsonl"


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINPILOT_CACHE", str(tmp_path / "cache"))


def _data(tmp_path, per_record: int = 3) -> Path:
    """Chat records with 1..``per_record`` pictures (content parts; tiny PNGs)."""
    from PIL import Image

    for i in range(3):
        Image.new("RGB", (64 + 32 * i, 48), (40 * i, 90, 200)).save(tmp_path / f"p{i}.png")
    rows = []
    for i in range(9):
        parts = [{"type": "image", "image": f"p{(i + k) % 3}.png"} for k in range(1 + i % per_record)]
        rows.append({"messages": [{"role": "user", "content": parts + [{"type": "text", "text": f"Colour {i}?"}]},
                                  {"role": "assistant", "content": f"Blue, {i}."}]})
    path = tmp_path / "pics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _cfg(tmp_path, arch="qwen2.5-vl-7b", **sections):
    d = {"model": {"architecture": arch}, "data": {"path": str(_data(tmp_path)), "seq_len": 4096, "packing": False},
         "method": {"type": "lora"}, "training": {"effective_batch_size": 16}}
    for k, v in sections.items():
        d.setdefault(k, {}).update(v)
    return C.validate(d)


def _plan(cfg):
    return plan_run(cfg, open_probe(str(DESKTOP)).snapshot(), alternatives=False)


@pytest.mark.parametrize("arch", ["qwen2.5-vl-3b", "qwen2.5-vl-7b", "gemma-3-4b"])
def test_shipped_vision_records_measure_the_tower(arch):
    spec = load_model_spec(arch)
    v = spec.vision
    assert v["tower"] and v["projector"] and v["depth"] >= 27 and "error" not in v["activations"]
    tower = v["activations"]["setups"]["tower"]
    assert v["activations"]["setups"]["frozen"]["layer"] == [0, 0.0, 0.0]  # a frozen tower saves nothing
    assert sum(tower["layer"]) > 0 and spec.frozen_params == v["tower_params"] + v["projector_params"]


def test_a_record_without_its_vision_part_is_probed_again(tmp_path):
    cfg = json.loads((Path(structure.STRUCTURES_DIR).parent / "gemma-3-4b.json").read_text())
    rec, origin = structure.cached_record(cfg)
    assert origin == "shipped" and "vision" in rec
    stale = {k: v for k, v in rec.items() if k != "vision"}
    folder = structure.user_records_dir()
    folder.mkdir(parents=True)
    (folder / f"{structure.config_hash(cfg)}.json").write_text(json.dumps(stale))
    assert structure._has_vision_part(stale, cfg) is False


def test_pictures_are_counted_from_the_scan_then_the_data_statistics(tmp_path):
    cfg = _cfg(tmp_path)
    unscanned = _plan(cfg).pictures
    assert unscanned["per_sample"] == 1 and not unscanned["from_data"]
    assert unscanned["tokens_per_picture"] == 16384  # Qwen2.5-VL's published max_pixels: 12,845,056 / 28²
    scan.scan(cfg.data.path, cfg.data)  # what Start and the Data page do: the scan counts pictures per record
    scanned = _plan(cfg)
    assert scanned.pictures["per_sample"] == 3
    assert any(r.startswith("pictures planned at the most the processor makes of one, 16,384 tokens") and
               "3 per sample (the data's most)" in r for r in scanned.reasons)
    token_stats.store(cfg, {"longest": 900, "records": 9, "pictures": {"max_per_record": 3, "image_tokens_per_picture": 88,
                                                                        "image_tokens_max_per_sample": 264}})
    measured = _plan(cfg)
    assert measured.pictures["from_data"] and measured.pictures["tokens_per_picture"] == 88
    assert measured.pictures["vision_positions_per_unit"] == 88 * 4
    assert measured.predicted_peak_bytes < scanned.predicted_peak_bytes


def test_image_max_pixels_caps_the_tokens_and_the_warning_names_the_cap(tmp_path):
    cfg = _cfg(tmp_path, data={"seq_len": 2048})
    plan = _plan(cfg)
    warning = next(r for r in plan.reasons if "fill data.seq_len 2,048" in r)
    assert "set data.image_max_pixels to 802,816 or less" in warning
    assert plan.pictures["suggested_image_max_pixels"] == 802_816
    capped = _plan(_cfg(tmp_path, data={"seq_len": 2048, "image_max_pixels": 802_816}))
    assert capped.pictures["tokens_per_picture"] == 1024 and not capped.pictures["tokens_over_seq_len"]
    assert "at most 802,816 pixels" in capped.pictures["image_max_pixels"]
    gemma = _plan(_cfg(tmp_path, arch="gemma-3-4b", data={"image_max_pixels": 10_000}))
    assert gemma.pictures["tokens_per_picture"] == 256 and "896×896" in gemma.pictures["image_max_pixels"] and \
        "cannot make it smaller" in gemma.pictures["image_max_pixels"]


def test_training_the_vision_side_adds_its_weights_and_activations(tmp_path):
    base = dict(data={"image_max_pixels": 401_408}, training={"micro_batch_size": 1, "gradient_accumulation_steps": 16},
                speed={"gradient_checkpointing": False, "activation_offload": False})
    plans = {tv: _plan(_cfg(tmp_path, method={"type": "lora", "train_vision": tv}, **base))
             for tv in ("none", "projector", "all")}
    p = {tv: plan.pictures for tv, plan in plans.items()}
    spec = load_model_spec("qwen2.5-vl-7b")
    assert p["none"]["vision_activation_bytes"] == 0 and p["none"]["vision_trained_params"] == 0
    assert p["projector"]["vision_trained_params"] == spec.vision["projector_params"]
    assert 0 < p["projector"]["vision_activation_bytes"] < p["all"]["vision_activation_bytes"]
    lora_tower = 32 * sum(16 * (i + o) for _, i, o, _b in spec.vision["block_linears"])
    assert p["all"]["vision_trained_params"] == spec.vision["projector_params"] + lora_tower
    peaks = [plans[tv].predicted_peak_bytes for tv in ("none", "projector", "all")]
    assert peaks == sorted(peaks) and peaks[0] < peaks[2]
    full = _plan(_cfg(tmp_path, method={"type": "full", "train_vision": "all"}, **base))
    assert full.pictures["vision_trained_params"] == spec.vision["projector_params"] + spec.vision["tower_params"]


def test_more_pictures_per_sample_cost_more(tmp_path):
    cfg = _cfg(tmp_path, training={"micro_batch_size": 1, "gradient_accumulation_steps": 16})
    peaks = []
    for per in (1, 2, 4):
        token_stats.store(cfg, {"longest": 200 + per * 600, "records": 9,
                                "pictures": {"max_per_record": per, "image_tokens_per_picture": 600}})
        peaks.append(_plan(cfg).predicted_peak_bytes)
    assert peaks[0] < peaks[1] < peaks[2]


def test_gemma3_with_pictures_plans_a_mask_in_every_layer(tmp_path):
    from trainer.planning import measured
    from trainer.planning.memory import TrainSetup

    spec = load_model_spec("gemma-3-4b")
    text = TrainSetup(micro_batch=1, seq_len=512)  # below the 1,024-token window: no masks without pictures
    with_pictures = TrainSetup(micro_batch=1, seq_len=512, pictures=1, picture_positions=4096)
    a, b = measured.layers_total(spec, text), measured.layers_total(spec, with_pictures)
    assert b - a >= 34 * 512 * 512 * 2 * 0.9  # every layer keeps a (1, 1, 512, 512) 16-bit mask


def test_processor_settings_of_a_local_folder_beat_the_defaults(tmp_path):
    cfg = json.loads((Path(structure.STRUCTURES_DIR).parent / "qwen2.5-vl-3b.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"min_pixels": 3136, "max_pixels": 200_704,
                                                                   "patch_size": 14, "merge_size": 2}))
    p = vision.for_model(cfg, tmp_path)
    assert vision.largest(p).tokens == 256 and str(tmp_path) in p.source


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smolvlm", "llava"])
def test_planned_picture_activations_within_10pct_of_autograd(name):
    """Whole model, real bf16 forward with pictures on the CPU, against the plan from the probe child's record."""
    import helpers_vision as hv

    from trainer.models.spec import spec_from_record
    from trainer.planning.memory import TrainSetup, activation_bytes

    cfg = hv.tiny_config(name)
    rec, origin = structure.record_for(cfg, name)
    spec = spec_from_record(rec, cfg, name, origin=origin)
    for lora, train_vision, ckpt in ((True, "none", False), (False, "all", False), (False, "all", True),
                                     (True, "all", False)):
        model, _ = hv.build(cfg, lora=lora, train_vision=train_vision)
        base = model.base_model.model if lora else model
        kwargs, image_tokens = hv.inputs(name, base, 2, 40, 3)
        got = hv.saved_bytes(model, kwargs, ckpt)
        _, units, positions = hv.geometry(name, base)
        s = TrainSetup(micro_batch=2, seq_len=40 + image_tokens, method="lora" if lora else "full", lora_r=8,
                       lora_dropout=0.05, device="cpu", checkpointing=ckpt, train_vision=train_vision, pictures=3,
                       picture_units=units, picture_positions=positions)
        a = activation_bytes(spec, s)
        planned = a["layers"] + a["head"] + a["vision"]
        assert abs(planned / got - 1) < 0.10, (lora, train_vision, ckpt, planned, got)


def test_picture_data_is_planned_unpacked_at_its_longest_sample(tmp_path):
    """Records with pictures are never packed (the worker's rule): with data.packing on, the plan still follows the
    data's longest sample, and pictures of varying sizes are planned from the heaviest sample's image tokens."""
    cfg = _cfg(tmp_path, data={"packing": True})
    scan.scan(cfg.data.path, cfg.data)
    token_stats.store(cfg, {"longest": 1500, "records": 9, "pictures": {
        "records_with_pictures": 9, "pictures": 18, "max_per_record": 3, "image_tokens_per_picture": None,
        "image_tokens_max_per_sample": 1200}})
    plan = _plan(cfg)
    assert any(r.startswith("memory is planned at 1500 tokens per sequence") for r in plan.reasons)
    assert plan.pictures["per_sample"] == 3 and plan.pictures["tokens_per_picture"] == 400
    assert any("1,200 image tokens in all (measured with the model's processor)" in r for r in plan.reasons)


def test_qlora_quantises_the_vision_tower_and_a_frozen_projector():
    """bitsandbytes quantises the vision tower's Linears as well (the worker's QLoRA), and the projector's unless it
    trains (then it stays 16-bit, trained whole)."""
    from trainer.planning import picture_memory as pictures
    from trainer.planning.memory import TrainSetup, estimate
    from trainer.planning.saver_memory import qlora_weight_bytes

    spec = load_model_spec("qwen2.5-vl-7b")
    frozen, projector = (estimate(spec, TrainSetup(method="qlora", train_vision=tv)).breakdown["weights"]
                         for tv in ("none", "projector"))
    tower = 32 * sum(i * o for _, i, o, _b in spec.vision["block_linears"])
    assert qlora_weight_bytes(spec) - frozen == pictures.qlora_vision_bytes_saved(
        spec, TrainSetup(method="qlora")) > 1.5 * tower * 0.95  # ~1.5 of the 2 bytes an element saved
    assert frozen < projector
