"""benchmarks/gpu_truth.py (and ladder_gpu.py beside it) cannot rot: its dry mode plans every row for every recorded
card on this (GPU-less) machine, its GPU mode says there is no GPU and exits cleanly, and the allocator cap it puts on
the children's PYTHONPATH is queued for torch's first CUDA initialisation."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.hardware.source import open_probe

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_truth.py"
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_truth  # noqa: E402

pytestmark = pytest.mark.slow  # child processes


def _run(*args, env=None):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, **(env or {})), timeout=600)


def test_dry_mode_plans_every_row_for_every_recorded_card(tmp_path):
    proc = _run("--dry", "--markdown", "--work", str(tmp_path), "--out", str(tmp_path / "dry.json"),
                env={"TRAINPILOT_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr
    cards = gpu_truth.cards(None, tmp_path)
    assert {"rtx4090_laptop_16gb", "desktop_24gb", "rtx5090_32gb", "rtx4090_laptop_16gb-apps-closed"} <= set(cards)
    lines = [line for line in proc.stdout.splitlines() if " planned " in line and not line.startswith("|")]
    recorded = [c for c in cards if not c.endswith("-apps-closed")]  # the derived cards only for rows naming them
    assert len(lines) == sum(len(set(r["cards"]) & set(cards)) if r["cards"] else len(recorded) for r in gpu_truth.ROWS)
    names = {r["name"] for r in gpu_truth.ROWS}
    assert {"full", "lora", "qlora-8b", "adamw-8bit", "offload", "compile", "dpo", "kto", "grpo", "long-8b-laptop",
            "long-8b-desktop"} <= names
    assert any("long-8b-laptop" in line and "rtx4090_laptop_16gb-apps-closed" in line and "tiled" in line
               for line in lines)
    assert proc.stdout.count("not measured: no GPU lent") == len(lines)


@pytest.mark.skipif(bool(open_probe().snapshot().gpus), reason="this machine has an NVIDIA GPU: it would measure")
def test_without_a_gpu_it_says_so_and_exits_cleanly(tmp_path):
    proc = _run("--only", "0", "--cards", "rtx4090_laptop_16gb", "--work", str(tmp_path),
                env={"TRAINPILOT_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0 and "no NVIDIA GPU on this machine" in proc.stdout


def test_the_cap_is_queued_for_torchs_first_cuda_initialisation(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(gpu_truth.SITECUSTOMIZE)
    code = "import torch; print(len(torch.cuda._queued_calls))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    without = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    with_cap = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                              env=dict(env, **{gpu_truth.CAP_ENV: str(12 * 2**30)}))
    assert int(with_cap.stdout.split()[-1]) == int(without.stdout.split()[-1]) + 1, with_cap.stderr


def test_the_ladder_check_plans_its_climb_through_the_cuda_rungs(tmp_path):
    """benchmarks/ladder_gpu.py (the ladder's CUDA rungs on a real GPU) cannot rot either: its dry mode plans the
    laptop run and lists the rungs it climbs, the tiled MLP among them; without a GPU it says so and exits 0."""
    script = REPO / "benchmarks" / "ladder_gpu.py"
    env = dict(os.environ, TRAINPILOT_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, str(script), "--dry", "--work", str(tmp_path / "dry")], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "device cuda" in proc.stdout and '{"speed.tiled_mlp": true}; {"speed.activation_offload": true}' in proc.stdout
    if not open_probe().snapshot().gpus:
        proc = subprocess.run([sys.executable, str(script), "--work", str(tmp_path / "run")], capture_output=True,
                              text=True, cwd=REPO, env=env, timeout=600)
        assert proc.returncode == 0 and "no NVIDIA GPU on this machine" in proc.stdout, proc.stderr
