"""The user's explicit settings win over the preset layered under them: the 16 GB laptop's preset
offloads the optimizer through DeepSpeed, and a config that says ``deepspeed.enabled: false`` is
planned without it (the best fit, or "does not fit"), never refused for an offload it never asked for."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from helpers_train import run_cli
from trainer import config as C
from trainer.config.presets import layer_with_rulings, machine_values
from trainer.hardware.source import open_probe
from trainer.planning.plan import plan_run

LAPTOP = Path(__file__).parent / "fixtures" / "hardware" / "rtx4090_laptop_16gb.jsonl"


def _laptop():
    probe = open_probe(str(LAPTOP))
    try:
        return probe.snapshot()
    finally:
        probe.close()


def _no_deepspeed(model: str) -> dict:
    return {"model": {"source": model}, "method": {"type": "full"}, "data": {"seq_len": 1024},
            "deepspeed": {"enabled": False}}


def test_the_preset_offload_is_ruled_out_by_an_explicit_no_deepspeed():
    assert machine_values("laptop_16gb")["deepspeed.offload_optimizer"] is True  # what the preset would layer
    layered, applied, ruled = layer_with_rulings(C.validate(_no_deepspeed("Qwen/Qwen2.5-0.5B")), "laptop_16gb")
    assert ruled == {"deepspeed.offload_optimizer": "deepspeed.enabled: false"}
    assert "deepspeed.offload_optimizer" not in applied and layered.deepspeed.offload_optimizer is False
    untouched, applied, ruled = layer_with_rulings(C.validate({}), "laptop_16gb")  # no explicit value: layered
    assert not ruled and untouched.deepspeed.offload_optimizer is True and untouched.deepspeed.enabled == "auto"


def test_no_deepspeed_on_the_16gb_laptop_plans_the_best_fit_without_it(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(_no_deepspeed("Qwen/Qwen2.5-0.5B")))
    proc = run_cli(["plan", str(cfg), "--hardware", str(LAPTOP), "--json"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["verdict"] in ("fits", "tight")
    assert plan["settings"].get("deepspeed.enabled", False) is False
    report = {v["key"]: v for v in plan["preset_values"]}
    offload = report["deepspeed.offload_optimizer"]
    assert (offload["status"], offload["planned"]) == ("yours", False) and "deepspeed.enabled: false" in offload["why"]


def test_no_deepspeed_says_does_not_fit_when_nothing_fits_without_it():
    plan = plan_run(C.validate(_no_deepspeed("Qwen/Qwen2.5-7B")), _laptop())
    assert plan.verdict == "does_not_fit" and plan.predicted_peak_bytes > plan.budget_bytes
    resolved = plan.resolved.deepspeed
    assert resolved.enabled is False and not resolved.offload_optimizer and not resolved.offload_params
    assert plan.alternatives, "it says what would fit instead"
