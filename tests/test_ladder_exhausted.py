"""The OOM ladder's whole climb with real DeepSpeed on the CPU (issue 41, "the ladder never crashes").

The config sets the micro-batch (the ladder keeps it) and leaves the loss, checkpointing and DeepSpeed to the
planner, so out of memory climbs chunked loss → checkpointing → ZeRO-2 optimizer offload → ZeRO-3 parameter offload.
Each DeepSpeed switch resumes the checkpoint the previous rung wrote, in another engine's format: weights, AdamW
moments and step count, learning-rate schedule and data position carry over, so every step's loss and learning rate
equal an uninterrupted plain run's. Before, the move from a plain checkpoint straight onto ZeRO-3 compared the saved
moments with ZeRO-3's partitioned (empty) parameters and ended in ``RuntimeError: …optimizer.pt: the state of
model.embed_tokens.weight has shape (1024, 64), the parameter (0,)`` — exit 1 with a traceback, not exit 3."""
from __future__ import annotations

import pytest
from helpers_train import cli, events, needs_deepspeed, tiny_config, write_config

pytestmark = [pytest.mark.slow, pytest.mark.deepspeed, needs_deepspeed, pytest.mark.xdist_group("ladder-climb"),
              pytest.mark.user_start]  # the OOM ladder: children start exactly as a user's (plugins/zygote.py)

STEPS = 6
RUNGS = [{"speed.loss_kernel": "chunked"}, {"speed.gradient_checkpointing": True},
         {"deepspeed.enabled": True, "deepspeed.zero_stage": 2, "deepspeed.offload_optimizer": True},
         {"deepspeed.zero_stage": 3, "deepspeed.offload_params": True}]
ENGINES = [None, None, None, "DeepSpeed ZeRO-2 with optimizer offload (CPU Adam)",
           "DeepSpeed ZeRO-3 with optimizer offload (CPU Adam)"]


def _config(tmp_path):
    data = tiny_config(training={"max_steps": STEPS, "micro_batch_size": 4, "gradient_accumulation_steps": 2},
                       speed={"precision": "fp32", "gradient_checkpointing": "auto"},
                       checkpoints={"every_steps": 1, "keep_last": 10})
    del data["deepspeed"]  # the planner's (off on the CPU), so the ladder may turn it on
    return write_config(tmp_path / "ladder.yaml", data)


@pytest.fixture(scope="module")
def direct(tmp_path_factory):
    """The same config, uninterrupted (plain PyTorch, HF's loss, no checkpointing): step → (loss, learning rate)."""
    tmp = tmp_path_factory.mktemp("direct")
    run = tmp / "run"
    proc = cli("run", _config(tmp), "--run-dir", run, "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _trained(run)


def _trained(run) -> dict[int, tuple[float, float]]:
    return {e["step"]: (e["loss"], e["learning_rate"]) for e in events(run, "step")}


def _assert_continuous(run, direct, steps, on_deepspeed) -> None:
    """Every step trained once, with the uninterrupted run's loss (moments restarted at a switch move the next loss
    by ~1e-3) and learning rate. HF logs a step's rate after DeepSpeed's engine stepped the schedule (accelerate
    steps it inside ``backward``), so the steps ``on_deepspeed`` show the rate after them: the linear schedule's
    3e-3 × (STEPS − step) / STEPS, which a restarted schedule would not."""
    got = _trained(run)
    assert sorted(got) == list(steps), got
    for step in steps:
        assert got[step][0] == pytest.approx(direct[step][0], abs=1e-5), (step, got[step], direct[step])
        rate = 3e-3 * (STEPS - step) / STEPS if step in on_deepspeed else direct[step][1]
        assert got[step][1] == pytest.approx(rate, rel=1e-6, abs=1e-12), (step, got[step], direct[step])


def _assert_retries(run, resume_steps) -> None:
    retries = events(run, "retry")
    assert [r["changes"] for r in retries] == RUNGS
    assert [r["resume_step"] for r in retries] == resume_steps
    assert [(e.get("engine_change") or {}).get("to") for e in events(run, "run_started")] == ENGINES
    for r in retries[2:]:  # each DeepSpeed switch carries everything
        change = r["engine_change"]
        assert "AdamW moments and step count (per parameter)" in change["carried"] and not change["not_carried"], r


def test_an_exhausted_ladder_ends_with_exit_3_and_what_would_fit(tmp_path, direct):
    """Out of memory on each attempt's second step: every rung trains one step and writes its checkpoint, so each
    switch resumes the previous rung's (ZeRO-2 a plain one, ZeRO-3 ZeRO-2's); ZeRO-3 runs out too, and the run ends
    with exit 3, what was tried and what would fit — no traceback anywhere."""
    run = tmp_path / "run"
    proc = cli("run", _config(tmp_path), "--run-dir", run, "--quiet", env={"TRAINPILOT_INJECT_OOM": "+2:0"})
    assert proc.returncode == 3, proc.stderr[-3000:]
    _assert_retries(run, [1, 2, 3, 4])
    _assert_continuous(run, direct, range(1, 6), on_deepspeed={4, 5})
    failed = events(run, "failed")[-1]
    assert failed["kind"] == "oom" and failed["exit_code"] == 3
    assert failed["message"].startswith("out of memory after 4 recovery step(s)"), failed
    assert "set training.micro_batch_size: 2, training.gradient_accumulation_steps: 4 yourself" in proc.stderr
    log = (run / "train.log").read_text()
    assert "Traceback" not in proc.stderr and "Traceback" not in log, (proc.stderr, log[-3000:])
    assert log.count("trainpilot worker: out of memory in training_step") == 5  # each attempt says it in one line
    assert (run / "checkpoints" / "checkpoint-5").is_dir()  # ZeRO-3's own step is kept for a resume


def test_the_zero3_rung_resumes_a_plain_checkpoint_and_finishes(tmp_path, direct):
    """Out of memory at step 2 until ZeRO-3: every rung before it fails before its first checkpoint, so ZeRO-3
    resumes the plain checkpoint-1 (the issue's crash) — its partitioned parameters get the plain run's moments —
    and trains the run to its end."""
    run = tmp_path / "run"
    proc = cli("run", _config(tmp_path), "--run-dir", run, "--quiet", env={"TRAINPILOT_INJECT_OOM": "2:4:zero3"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_retries(run, [1, 1, 1, 1])
    assert events(run, "retry")[-1]["engine_change"]["from"] == "plain PyTorch (AdamW)"
    _assert_continuous(run, direct, range(1, STEPS + 1), on_deepspeed=range(2, STEPS + 1))
    assert events(run, "finished")[-1]["wrapped_model"] == "DeepSpeedEngine"
    assert (run / "final" / "model.safetensors").is_file()
