"""Real DeepSpeed through HF's integration, on the CPU (accelerator 'cpu'); first run JIT-builds CPU Adam."""
import json

import pytest
import torch
from helpers_train import (
    cli,
    events,
    final_weights,
    losses,
    needs_deepspeed,
    tiny_config,
    write_config,
)

pytestmark = [pytest.mark.slow, pytest.mark.deepspeed, needs_deepspeed]


def _run(tmp_path, name, ds, steps=5, env=None, **extra):
    cfg = write_config(tmp_path / f"{name}.yaml", tiny_config(deepspeed=dict(enabled=True, **ds),
                                                              training={"max_steps": steps}, **extra))
    run = tmp_path / name
    proc = cli("run", cfg, "--run-dir", run, "--quiet", env=env)
    return run, proc


def test_zero2_offload_trains_then_a_stopped_run_resumes_exactly(tmp_path):
    """ZeRO-2 with CPU optimizer offload trains (DeepSpeed's engine, its config, its own checkpoints), and a run
    stopped at step 3 and resumed gives the uninterrupted run's losses and weights."""
    ds = {"zero_stage": 2, "offload_optimizer": True}
    full, proc = _run(tmp_path, "full", ds, steps=6)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [e["step"] for e in events(full, "step")] == list(range(1, 7))
    # one process, yet DeepSpeed has its process group (rank 0 of 1; without it DeepSpeed tries MPI discovery)
    assert events(full, "finished")[-1]["wrapped_model"] == "DeepSpeedEngine"
    cfg = json.loads((full / "ds_config.json").read_text())
    assert cfg["zero_optimization"]["stage"] == 2 and cfg["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert cfg["train_batch_size"] == 8 and cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] == 8
    ckpt = full / "checkpoints" / "checkpoint-4"
    assert any(p.name.startswith("global_step") for p in ckpt.iterdir()), "DeepSpeed's own checkpoint inside"
    part, proc = _run(tmp_path, "part", ds, steps=6, env={"TRAINPILOT_INJECT_STOP": "3"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert events(part, "stopped")[-1]["step"] == 3
    assert (part / "checkpoints" / "checkpoint-3").is_dir()
    proc = cli("resume", part, "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = losses(full), losses(part)
    assert sorted(b) == list(range(1, 7))
    for step in a:
        assert b[step] == pytest.approx(a[step], abs=1e-6), step
    wa, wb = final_weights(full), final_weights(part)
    for name in wa:
        assert torch.allclose(wa[name], wb[name], atol=1e-6), name


def test_the_ladder_moves_a_run_onto_deepspeed_and_to_zero3_carrying_its_state(tmp_path):
    """Issue 29: moving a run from plain PyTorch to DeepSpeed resumed from a checkpoint DeepSpeed cannot read ("Can't
    find a valid checkpoint", exit 1). Out of memory on the 3rd step of every attempt until ZeRO-3: the micro-batch and
    checkpointing are the config's, so the ladder goes to ZeRO-2 optimizer offload (resuming plain checkpoint-2), then
    to ZeRO-3 parameter offload (resuming ZeRO-2's checkpoint-4). Weights, AdamW moments, schedule, data position and
    random state carry over: every step's loss equals an uninterrupted plain run's (with the moments restarted, step
    4's loss moves by 3.6e-3)."""
    data = tiny_config(training={"max_steps": 6})
    del data["deepspeed"]  # left to the ladder
    data["speed"]["loss_kernel"] = "chunked"  # set: the ladder's loss rung has nothing to change (tested apart)
    cfg = write_config(tmp_path / "c.yaml", data)
    run = tmp_path / "ladder"
    proc = cli("run", cfg, "--run-dir", run, "--quiet", env={"TRAINPILOT_INJECT_OOM": "+3:0:zero3"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    retries = events(run, "retry")
    assert [r["changes"] for r in retries] == [
        {"deepspeed.enabled": True, "deepspeed.zero_stage": 2, "deepspeed.offload_optimizer": True},
        {"deepspeed.zero_stage": 3, "deepspeed.offload_params": True}]
    assert [r["resume_step"] for r in retries] == [2, 4]
    for r in retries:
        change = r["engine_change"]
        assert "AdamW moments and step count (per parameter)" in change["carried"] and not change["not_carried"]
    assert [(e.get("engine_change") or {}).get("to") for e in events(run, "run_started")] == [
        None, "DeepSpeed ZeRO-2 with optimizer offload (CPU Adam)", "DeepSpeed ZeRO-3 with optimizer offload (CPU Adam)"]
    assert events(run, "finished")[-1]["wrapped_model"] == "DeepSpeedEngine"
    ds = json.loads((run / "ds_config.json").read_text())  # the last attempt's: ZeRO-3, weights and states offloaded
    assert ds["zero_optimization"]["stage"] == 3 and ds["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert (run / "final" / "model.safetensors").is_file()  # ZeRO-3's shards gathered into one model
    direct = tmp_path / "direct"
    proc = cli("run", cfg, "--run-dir", direct, "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = losses(direct), losses(run)
    assert sorted(b) == list(range(1, 7))
    for step in a:
        assert b[step] == pytest.approx(a[step], abs=1e-5), step
