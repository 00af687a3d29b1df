"""Presets mean something: the tier's preset is the base layer under the user's config, the planner
starts from it, and the plan says which preset values it kept, which it changed and why."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainer import config as C
from trainer.config.presets import is_machine_key, layer, load_preset, machine_values
from trainer.config.resolved import as_resolved
from trainer.core.paths import PRESETS_DIR
from trainer.hardware.source import open_probe
from trainer.planning.budget import TIER_PRESETS
from trainer.planning.plan import plan_run

FIX = Path(__file__).parent / "fixtures" / "hardware"
LAPTOP = FIX / "rtx4090_laptop_16gb.jsonl"
ALL_PRESETS = sorted(set(TIER_PRESETS.values()) | {"cpu"})


@pytest.mark.parametrize("name", ALL_PRESETS)
def test_every_tier_preset_exists_validates_and_layers(name):
    """Fails (never skips) when a preset the planner can pick is missing or invalid."""
    assert (PRESETS_DIR / f"{name}.yaml").is_file(), f"the planner picks preset {name} but it is not shipped"
    C.validate(load_preset(name))  # the file is a complete, valid config on its own
    layered, applied = layer(C.validate({}), name)
    assert applied and all(is_machine_key(k) for k in applied)
    assert C.validate(C.to_dict(layered)) == layered


def _plan(**sections):
    cfg = C.validate({"model": {"architecture": sections.pop("arch", "qwen2.5-0.5b")}, **sections})
    return plan_run(cfg, open_probe(str(LAPTOP)).snapshot())


def _report(plan) -> dict:
    return {v["key"]: v for v in plan.preset_values}


def test_laptop_plan_reports_preset_values_kept_and_changed():
    plan = _plan(data={"seq_len": 1024})
    rep = _report(plan)
    assert plan.preset == "laptop_16gb" and plan.verdict == "fits"
    assert set(rep) == set(machine_values("laptop_16gb"))
    # applied from the preset and kept: the checkpoint cadence (the schema default is 50)
    assert rep["checkpoints.every_steps"] == {**rep["checkpoints.every_steps"], "status": "kept", "preset": 100}
    assert plan.resolved.checkpoints.every_steps == 100
    # the preset's micro-batch 1 is where the planner starts; a larger one fits, so it changed it, and says why
    micro = rep["training.micro_batch_size"]
    assert (micro["status"], micro["preset"]) == ("changed", 1) and micro["planned"] == plan.resolved.training.micro_batch_size > 1
    assert "largest that fits" in micro["why"]
    ds = rep["deepspeed.enabled"]
    assert (ds["status"], ds["planned"]) == ("changed", False) and "DeepSpeed off" in ds["why"]
    t = plan.resolved.training
    assert t.micro_batch_size * t.gradient_accumulation_steps == t.effective_batch_size


def test_a_bigger_model_keeps_the_presets_small_micro_batch_and_checkpointing():
    # HF's loss (with the chunked loss a 1B fits a larger micro-batch at 1024 on 16 GB); activation offload off: on
    # this card the planner estimates it faster than checkpointing (issue 31; tests/test_saver_memory.py)
    rep = _report(_plan(arch="llama-3.2-1b", data={"seq_len": 1024},
                        speed={"loss_kernel": "hf", "activation_offload": False}))
    assert rep["training.micro_batch_size"]["status"] == "kept"
    assert rep["speed.gradient_checkpointing"]["status"] == "kept"


def test_the_users_values_win_over_the_preset():
    plan = _plan(data={"seq_len": 1024}, speed={"gradient_checkpointing": True}, checkpoints={"every_steps": 7})
    rep = _report(plan)
    assert rep["speed.gradient_checkpointing"]["status"] == "yours"
    assert rep["checkpoints.every_steps"] == {**rep["checkpoints.every_steps"], "status": "yours", "planned": 7}
    assert plan.resolved.speed.gradient_checkpointing is True and plan.resolved.checkpoints.every_steps == 7


def test_the_training_recipe_is_never_taken_from_a_preset():
    """A preset file's recipe values (sequence length, effective batch) apply only when that file is the
    config itself: the same config must train the same way on every machine."""
    assert load_preset("desktop_24gb")["data"]["seq_len"] == 4096
    layered, applied = layer(C.validate({}), "desktop_24gb")
    assert "data.seq_len" not in applied and layered.data.seq_len == C.validate({}).data.seq_len
    assert "training.effective_batch_size" not in applied


def test_the_resolved_config_has_no_auto_left_and_is_typed_so():
    resolved = as_resolved(_plan(data={"seq_len": 1024}).resolved)
    assert isinstance(resolved.training.micro_batch_size, int)
    assert resolved.speed.precision == "bf16" and resolved.device == "cuda" and resolved.model.dtype == "bfloat16"
    assert resolved.distributed.launcher == "single"
