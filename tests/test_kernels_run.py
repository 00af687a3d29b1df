"""The kernels through the path a user takes: a run with ``speed.tiled_mlp: true`` and gradient checkpointing trains
through ``python -m trainer run`` on the CPU with the plain run's losses, says what it installed in run_started, and a
stop/resume of it is exact (the harness of tests/test_resume.py)."""
from __future__ import annotations

import pytest
import torch
from helpers_train import cli, events, final_weights, losses, tiny_config, write_config

pytestmark = pytest.mark.slow

STEPS = dict(training={"max_steps": 6}, checkpoints={"every_steps": 5})


def test_a_tiled_checkpointed_run_trains_as_the_plain_one_and_resumes_exactly(tmp_path):
    plain = write_config(tmp_path / "plain.yaml", tiny_config(**STEPS))
    tiled = write_config(tmp_path / "tiled.yaml", tiny_config(**STEPS, speed={"gradient_checkpointing": True,
                                                                                "tiled_mlp": True}))
    runs = {name: tmp_path / name for name in ("plain", "tiled", "part")}
    assert cli("run", plain, "--run-dir", runs["plain"], "--quiet").returncode == 0
    proc = cli("run", tiled, "--run-dir", runs["tiled"], "--quiet")
    assert proc.returncode == 0, proc.stderr
    started = events(runs["tiled"], "run_started")[0]
    assert started["tiled_blocks"] == 2 * 3 and started["activation_offload"] is None  # 2 layers: MLP + 2 norms
    assert started["cuda_alloc_conf"] is None  # a CPU worker
    a, b = losses(runs["plain"]), losses(runs["tiled"])
    assert a.keys() == b.keys() and len(a) == 6
    for step in a:  # tiles sum in another order: fp32 rounding, compounded by six AdamW steps
        assert b[step] == pytest.approx(a[step], rel=1e-5), step
    proc = cli("run", tiled, "--run-dir", runs["part"], "--quiet", env={"TRAINPILOT_INJECT_STOP": "3"})
    assert proc.returncode == 0, proc.stderr
    assert cli("resume", runs["part"], "--quiet").returncode == 0
    c = losses(runs["part"])
    assert c.keys() == b.keys() and all(c[s] == pytest.approx(b[s], abs=1e-6) for s in b)
    wb, wc = final_weights(runs["tiled"]), final_weights(runs["part"])
    assert all(torch.allclose(wb[n], wc[n], atol=1e-6) for n in wb)
