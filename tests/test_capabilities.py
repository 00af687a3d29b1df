"""One capabilities probe (trainer/core/capabilities.py) answers "is X installed" for the doctor, preflight,
the wizard's Review (``preflight.start_problems``), the planner and the OOM ladder; Review's problems are
the ones Start refuses, in the same words."""
from __future__ import annotations

import importlib.util
import sys

import pytest

from helpers_cli import REPO, run_cli, write_config, write_demo_data
from trainer import config as tc
from trainer.core import capabilities
from trainer.hardware.source import open_probe
from trainer.planning import ladder
from trainer.supervisor import doctor, preflight

LAPTOP = REPO / "tests" / "fixtures" / "hardware" / "rtx4090_laptop_16gb.jsonl"
NO_GPU = REPO / "tests" / "fixtures" / "hardware" / "no_gpu.jsonl"
# "bitsandbytes is not installed" whatever this machine has: a None entry in sys.modules hides a package.
HIDE = "import sys; sys.modules['bitsandbytes'] = None; sys.argv[0] = 'trainpilot-cli'; " \
       "from trainer.cli.main import main; sys.exit(main(sys.argv[1:]))"


def _laptop(path=LAPTOP):
    probe = open_probe(str(path))
    try:
        return probe.snapshot()
    finally:
        probe.close()


def test_installed_is_find_spec_and_a_hidden_package_reads_missing(monkeypatch):
    for name, opt in capabilities.OPTIONAL.items():
        found = all(importlib.util.find_spec(m) is not None for m in (opt.module, *opt.requires))
        assert capabilities.installed(name) is found, name
    assert capabilities.OPTIONAL["liger-kernel"].requires == ("triton",)  # Liger's kernels are Triton programs
    monkeypatch.setitem(sys.modules, "deepspeed", None)
    caps = capabilities.probe(_laptop())
    assert not caps.has("deepspeed") and caps.cuda_gpu is True
    assert caps.packages["deepspeed"].version is None and "pip install" in caps.packages["deepspeed"].install
    assert capabilities.probe(None).cuda_gpu is None


def test_the_doctor_says_what_the_probe_says(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", None)
    monkeypatch.setitem(sys.modules, "deepspeed", None)
    checks = {c["name"]: c for c in doctor.light_checks("runs", _laptop())}
    assert not checks["flash-attn"]["ok"] and "flash-attn" in checks["flash-attn"]["fix"]
    assert not checks["deepspeed"]["ok"] and "pip install" in checks["deepspeed"]["fix"]
    for name in capabilities.OPTIONAL:
        if name not in ("flash-attn", "deepspeed", *doctor.TORCH_SIDE):
            assert checks[name]["ok"] is capabilities.installed(name), name
    assert not set(doctor.TORCH_SIDE) & set(checks)  # the torch-side child's loss kernel, 4-bit and 8-bit lines


def test_the_ladder_stops_before_deepspeed_when_it_is_missing(monkeypatch, tmp_path):
    write_demo_data(tmp_path / "train.jsonl", 20)
    cfg = tc.load(write_config(tmp_path, {"speed.gradient_checkpointing": True, "speed.loss_kernel": "chunked"}))
    monkeypatch.setitem(sys.modules, "deepspeed", None)
    assert ladder.next_step(cfg) is None
    monkeypatch.delitem(sys.modules, "deepspeed")
    if capabilities.installed("deepspeed"):
        assert ladder.next_step(cfg).changes["deepspeed.offload_optimizer"] is True


def test_review_blocks_qlora_without_bitsandbytes_as_start_refuses_it(monkeypatch, tmp_path):
    write_demo_data(tmp_path / "train.jsonl", 20)
    path = write_config(tmp_path, {"device": "auto", "method.type": "qlora", "speed.precision": "auto", "deepspeed.enabled": "auto",
                                   "output.runs_dir": str(tmp_path / "runs")})
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    ready = preflight.start_problems(tc.load(path), _laptop(), run_dir=tmp_path / "runs" / "r")
    assert not ready.ready and ready.plan is not None
    (field, message), = [p for p in ready.problems if p[0] == "method.type"]
    assert "bitsandbytes" in message and "pip install bitsandbytes" in message
    start = run_cli(["run", str(path), "--hardware", str(LAPTOP), "--run-dir", str(tmp_path / "runs" / "r")],
                    cwd=tmp_path, python_code=HIDE)
    assert start.returncode == 2 and f"{field}: {message}" in start.stderr
    assert "Traceback" not in start.stderr and not (tmp_path / "runs").exists()


def test_review_blocks_a_run_folder_start_cannot_create(tmp_path):
    write_demo_data(tmp_path / "train.jsonl", 20)
    (tmp_path / "afile").write_text("mine\n")
    path = write_config(tmp_path)
    ready = preflight.start_problems(tc.load(path), _laptop(NO_GPU), run_dir=tmp_path / "afile" / "run")
    (field, message), = ready.problems
    assert field == "output.runs_dir" and "afile" in message and "choose a folder" in message
    start = run_cli(["run", str(path), "--hardware", str(NO_GPU), "--run-dir", str(tmp_path / "afile" / "run")],
                    cwd=tmp_path)
    assert start.returncode == 2 and message in start.stderr


def test_review_of_a_good_config_is_ready_and_creates_nothing(tmp_path):
    write_demo_data(tmp_path / "train.jsonl", 20)
    ready = preflight.start_problems(tc.load(write_config(tmp_path)), _laptop(NO_GPU))
    assert ready.ready, ready.problems
    assert ready.run_dir.parent == tmp_path / "runs" and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("changes, field, package", [
    ({"training.optimizer": "adamw_8bit"}, "training.optimizer", "bitsandbytes"),
    ({"model.attn_implementation": "flash_attention_2"}, "model.attn_implementation", "flash-attn"),
])
def test_machine_problems_name_the_field_and_the_install(monkeypatch, tmp_path, changes, field, package):
    write_demo_data(tmp_path / "train.jsonl", 20)
    monkeypatch.setitem(sys.modules, capabilities.OPTIONAL[package].module, None)
    cfg = tc.load(write_config(tmp_path, {**changes, "device": "auto"}))
    problems = dict(preflight.machine_problems(cfg, _laptop()))
    assert package in problems[field] and "pip install" in problems[field]


def test_a_tracker_that_is_not_installed_is_refused_before_start(monkeypatch, tmp_path):
    write_demo_data(tmp_path / "train.jsonl", 20)
    monkeypatch.setitem(sys.modules, "wandb", None)
    cfg = tc.load(write_config(tmp_path, {"output.report_to": ["wandb"]}))
    problems = dict(preflight.machine_problems(cfg, _laptop(NO_GPU)))
    assert "wandb is not installed" in problems["output.report_to"]
    assert "pip install wandb" in problems["output.report_to"]
    checks = {c["name"]: c for c in doctor.light_checks("runs", _laptop(NO_GPU))}
    assert not checks["wandb"]["ok"] and checks["mlflow"]["ok"] is capabilities.installed("mlflow")
