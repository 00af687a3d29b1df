"""doctor, the probe/plan CLI and the measured-plan correction. The doctor's torch checks run in
a real child process; the measuring step's GPU child is replaced only where no GPU exists. A test that needs a
tool the machine lacks (torch, DeepSpeed) skips locally and fails in CI (``helpers_ci``)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers_ci import require_module
from trainer import config as C
from trainer.cli.main import main
from trainer.core.errors import UserError
from trainer.hardware.source import open_probe
from trainer.planning.step_probe import measure_plan
from trainer.planning.plan import plan_run
from trainer.supervisor.doctor import light_checks, run_torch_checks_in_child

ROOT = Path(__file__).parents[1]
FIX = ROOT / "tests" / "fixtures" / "hardware"
LAPTOP = str(FIX / "rtx4090_laptop_16gb.jsonl")


def test_light_checks_have_fixes():
    checks = light_checks("runs", open_probe(str(FIX / "no_gpu.jsonl")).snapshot())
    names = {c["name"] for c in checks}
    assert {"python", "nvidia gpu", "host ram", "free disk"} <= names
    gpu = next(c for c in checks if c["name"] == "nvidia gpu")
    assert not gpu["ok"] and "driver" in gpu["fix"] and not gpu["required"]
    assert all(set(c) == {"name", "ok", "detail", "fix", "required"} for c in checks)


@pytest.mark.slow  # a child process or a model load: seconds (pytest -m 'not slow' stays under 4 min)
def test_torch_checks_run_in_a_child_process(tmp_path, monkeypatch):
    # the installer's record of the GPU extras (docs/install.md): its reasons reach the doctor's lines
    state = tmp_path / "install-state.json"
    reason = "bitsandbytes (QLoRA's 4-bit weights and 8-bit AdamW) not installed: recorded by the installer"
    state.write_text(json.dumps({"gpu_extras": {"bitsandbytes": {"planned": False, "reason": reason},
                                                "liger-kernel": {"planned": True, "install_error": "pip failed"}}}))
    monkeypatch.setenv("TRAINPILOT_INSTALL_STATE", str(state))
    before = "torch" in sys.modules
    checks = run_torch_checks_in_child()
    assert ("torch" in sys.modules) == before  # the caller never imports torch
    by = {c["name"]: c for c in checks}
    assert by["torch"]["ok"] and "torch" in by["torch"]["detail"]
    assert "transformers" in by and "deepspeed" in by
    gpu = by["torch sees the gpu"]["ok"]
    if not gpu:
        assert by["torch sees the gpu"]["fix"]
    # which loss kernel, 4-bit and 8-bit support this machine has, each with its one-line fix when missing
    for name in ("loss kernel", "4-bit (QLoRA)", "8-bit AdamW"):
        assert not by[name]["required"] and bool(by[name]["fix"]) is not by[name]["ok"], by[name]
    from trainer.core import capabilities
    if not gpu:  # Liger's, bitsandbytes' kernels need an NVIDIA GPU: never claimed without one
        assert not by["loss kernel"]["ok"] and "chunked loss and HF's loss" in by["loss kernel"]["detail"]
        assert not by["4-bit (QLoRA)"]["ok"] and not by["8-bit AdamW"]["ok"]
    if not capabilities.installed("bitsandbytes"):
        assert "pip install bitsandbytes" in by["4-bit (QLoRA)"]["fix"] and reason in by["4-bit (QLoRA)"]["detail"]
    if gpu and not capabilities.installed("liger-kernel"):
        assert "pip failed" in by["loss kernel"]["detail"] and "liger-kernel" in by["loss kernel"]["fix"]


def test_cli_probe_json_and_record(tmp_path, capsys):
    assert main(["probe", "--json", "--hardware", LAPTOP]) == 0
    snap = json.loads(capsys.readouterr().out)
    assert snap["gpus"][0]["name"].endswith("Laptop GPU")
    out = tmp_path / "rec.jsonl"
    assert main(["probe", "--record", str(out), "--seconds", "0.2", "--interval", "0.1"]) == 0
    lines = out.read_text().splitlines()
    assert json.loads(lines[0])["recording"]["kind"] == "real" and len(lines) >= 3
    assert main(["probe", "--hardware", str(out)]) == 0


def test_cli_plan_text_json_and_errors(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model:\n  architecture: llama-3.2-1b\n")
    assert main(["plan", str(cfg), "--hardware", LAPTOP, "--json", "--set", "data.seq_len=1024"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["preset"] == "laptop_16gb" and d["verdict"] == "fits" and d["predicted_peak_bytes"] <= d["budget_bytes"]
    assert main(["plan", str(cfg), "--hardware", LAPTOP, "--json", "--set", "data.seq_len=131072",
                 "--set", "training.micro_batch_size=8", "--set", "training.gradient_accumulation_steps=1",
                 "--set", "training.effective_batch_size=8"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "does_not_fit"  # the verdict follows the numbers
    assert main(["plan", str(cfg), "--hardware", LAPTOP]) == 0
    assert "verdict:" in capsys.readouterr().out
    assert main(["plan", str(cfg), "--hardware", str(tmp_path / "none.jsonl")]) == 2
    assert "not found" in capsys.readouterr().err


def test_plan_measure_without_gpu_exits_2(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model:\n  architecture: demo-tiny-llama\n")
    assert main(["plan", str(cfg), "--measure", "--hardware", str(FIX / "no_gpu.jsonl")]) == 2
    assert "measuring needs an NVIDIA GPU" in capsys.readouterr().err


@pytest.mark.slow  # measured >= 3.5 s on the 2-core machine
def test_measure_child_refuses_without_cuda_and_measures_with_it(tmp_path):
    torch = require_module("torch", "pip install torch==2.13.0 (installers/linux/dev-setup.sh)")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model:\n  architecture: demo-tiny-llama\n")
    out = subprocess.run([sys.executable, "-m", "trainer.worker.probes.memory_probe", str(cfg), "--micro-batch", "1", "--out",
                          str(tmp_path / "m.json")], capture_output=True, text=True, cwd=ROOT, timeout=300)
    if torch.cuda.is_available():  # a GPU machine measures instead
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads((tmp_path / "m.json").read_text())["peak_reserved_bytes"] > 0
    else:
        assert out.returncode == 2 and "needs an NVIDIA GPU" in out.stderr


def _measured(scale):
    """What a GPU child would report: the prediction scaled by ``scale``, less what the CUDA runtime holds outside
    torch's reserve (the context and the kernel modules, as the plan has them: ``measure`` adds them back)."""
    from trainer.models.spec import load_model_spec
    from trainer.planning.context import Context
    from trainer.planning.step_probe import _setup
    from trainer.planning.memory import estimate

    def probe(cfg, mb):
        hw = open_probe(LAPTOP).snapshot()
        ctx = Context.build(cfg, hw, hw.gpus[0], "cuda", "fastest")
        est = estimate(load_model_spec("llama-3.2-1b"), _setup(ctx, cfg, mb))
        runtime = est.breakdown["cuda_context"] + est.breakdown["cuda_kernels"]
        return {"micro_batch": mb, "peak_reserved_bytes": int(scale * est.peak_bytes) - runtime, "device": "replay"}
    return probe


def _planned_peak(cfg, mb: int) -> int:
    """The plan's peak for ``cfg`` at micro-batch ``mb`` on the laptop (what ``_measured`` scales)."""
    from trainer.models.spec import load_model_spec
    from trainer.planning.context import Context
    from trainer.planning.memory import estimate
    from trainer.planning.step_probe import _setup

    hw = open_probe(LAPTOP).snapshot()
    ctx = Context.build(cfg, hw, hw.gpus[0], "cuda", "fastest")
    return estimate(load_model_spec("llama-3.2-1b"), _setup(ctx, cfg, mb)).peak_bytes


@pytest.mark.parametrize("case", ["as_planned", "under", "over_the_plans", "over_every_micro_batch", "far_over"])
def test_measured_correction_keeps_effective_batch_and_uses_at_most_two_runs(case):
    """Llama-3.2-1B full on the laptop: its fixed part (weights, gradients with the tied embedding's extra ones,
    states) is most of the 12.8 GiB budget. Measured as planned, the plan stays (one run); under, it stays; over the
    plan's micro-batch but not a smaller one's, a smaller micro-batch is taken; over even micro-batch 1's, none fits
    (said, not hidden). The scales are read off the plan's own peaks, so the cases hold whatever the plan picks."""
    hw = open_probe(LAPTOP).snapshot()
    c = C.validate({"model": {"architecture": "llama-3.2-1b"}, "data": {"seq_len": 256},
                    "training": {"effective_batch_size": 32}})
    plan = plan_run(c, hw)
    before = plan.resolved.training.micro_batch_size
    assert before > 1, "the cases need a plan above micro-batch 1"
    budget = plan.budget_bytes
    smaller = max(d for d in range(1, before) if 32 % d == 0)
    scale = {"as_planned": 1.0, "under": 0.6,
             "over_the_plans": (budget / _planned_peak(plan.resolved, before) +
                                budget / _planned_peak(plan.resolved, smaller)) / 2,
             "over_every_micro_batch": 1.02 * budget / _planned_peak(plan.resolved, 1), "far_over": 1.4}[case]
    report = measure_plan(plan, hw, probe=_measured(scale))
    assert len(report["runs"]) <= 2
    after = plan.resolved.training
    assert after.micro_batch_size * after.gradient_accumulation_steps == 32
    if case == "as_planned":
        assert after.micro_batch_size == before and len(report["runs"]) == 1
    elif case in ("over_every_micro_batch", "far_over"):  # even micro-batch 1 would not fit once scaled: said
        assert plan.verdict == "does_not_fit" and any("does not fit" in n for n in plan.notes)
    elif case == "over_the_plans":
        assert after.micro_batch_size < before
    else:
        assert after.micro_batch_size >= before


def test_measure_plan_needs_gpu():
    hw = open_probe(str(FIX / "no_gpu.jsonl")).snapshot()
    plan = plan_run(C.validate({"model": {"architecture": "demo-tiny-llama"}}), hw)
    with pytest.raises(UserError, match="needs an NVIDIA GPU"):
        measure_plan(plan, hw)


@pytest.mark.slow  # DeepSpeed steps in a child process
@pytest.mark.deepspeed
@pytest.mark.parametrize("stage", [2, 3])
def test_measuring_deepspeed_engine_runs_real_steps(stage):
    """The engine plan --measure (and the GPU benchmark) builds, on DeepSpeed's CPU accelerator."""
    require_module("torch", "pip install torch==2.13.0 (installers/linux/dev-setup.sh)")
    require_module("deepspeed", "pip install --no-build-isolation deepspeed (installers/linux/dev-setup.sh)")
    # In a child process: DeepSpeed patches torch process-wide (process group, ZeRO-3 linear), which
    # would leak into every later test of this session.
    code = f"""
import torch
from trainer.worker.probes.memory_probe import build_model, deepspeed_engine
engine = deepspeed_engine(build_model("tiny-llama", "bf16", "sdpa"), 2, {stage}, False, False)
for _ in range(2):
    ids = torch.randint(0, 1024, (2, 32), device=engine.device)
    loss = engine(input_ids=ids, labels=ids, use_cache=False).loss
    engine.backward(loss)
    engine.step()
assert torch.isfinite(loss), loss
print("LOSS", float(loss))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         cwd=Path(__file__).parents[1])
    assert out.returncode == 0 and "LOSS" in out.stdout, out.stderr[-3000:]
