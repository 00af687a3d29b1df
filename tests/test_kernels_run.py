"""The kernels through the path a user takes: a run with ``speed.tiled_mlp: true``, gradient checkpointing and
``speed.activation_offload: true`` trains through ``python -m trainer run`` on the CPU with the plain run's losses,
says what it installed, and a stop/resume of it is exact (the harness of tests/test_resume.py). On the CPU the
offload is driven by TRAINPILOT_INJECT_CPU_OFFLOAD (host copies: a CPU has no device memory to free; without it the
worker refuses speed.activation_offload there, tests/test_plan_savers.py)."""
from __future__ import annotations

import pytest
import torch
from helpers_train import cli, events, final_weights, losses, tiny_config, write_config

pytestmark = pytest.mark.slow

STEPS = dict(training={"max_steps": 6}, checkpoints={"every_steps": 5})
CPU_OFFLOAD = {"TRAINPILOT_INJECT_CPU_OFFLOAD": "1"}


def test_a_tiled_offloaded_run_trains_as_the_plain_one_and_resumes_exactly(tmp_path):
    plain = write_config(tmp_path / "plain.yaml", tiny_config(**STEPS))
    kernels = write_config(tmp_path / "kernels.yaml", tiny_config(**STEPS, speed={
        "gradient_checkpointing": True, "tiled_mlp": True, "activation_offload": True}))
    runs = {name: tmp_path / name for name in ("plain", "kernels", "part")}
    assert cli("run", plain, "--run-dir", runs["plain"], "--quiet").returncode == 0
    proc = cli("run", kernels, "--run-dir", runs["kernels"], "--quiet", env=CPU_OFFLOAD)
    assert proc.returncode == 0, proc.stderr
    started = events(runs["kernels"], "run_started")[0]
    assert started["tiled_blocks"] == 2 * 3  # 2 layers: the MLP and 2 norms each
    assert started["activation_offload"] == "checkpoint_inputs" and started["cuda_alloc_conf"] is None
    log = (runs["kernels"] / "train.log").read_text()
    assert "each checkpointed layer input (0.1 MiB) is kept in host RAM" in log  # 4 × 64 tokens × 64 × fp32
    a, b = losses(runs["plain"]), losses(runs["kernels"])
    assert a.keys() == b.keys() and len(a) == 6
    for step in a:  # tiles sum in another order: fp32 rounding, compounded by six AdamW steps
        assert b[step] == pytest.approx(a[step], rel=1e-5), step
    proc = cli("run", kernels, "--run-dir", runs["part"], "--quiet", env={**CPU_OFFLOAD, "TRAINPILOT_INJECT_STOP": "3"})
    assert proc.returncode == 0, proc.stderr
    assert cli("resume", runs["part"], "--quiet", env=CPU_OFFLOAD).returncode == 0
    c = losses(runs["part"])
    assert c.keys() == b.keys() and all(c[s] == pytest.approx(b[s], abs=1e-6) for s in b)
    wb, wc = final_weights(runs["kernels"]), final_weights(runs["part"])
    assert all(torch.allclose(wb[n], wc[n], atol=1e-6) for n in wb)
