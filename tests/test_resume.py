"""Runs that survive: exact stop/resume, kill -9 at random moments, the OOM ladder."""
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers_train import (
    REPO,
    cli,
    events,
    final_weights,
    losses,
    tiny_config,
    write_config,
)

from trainer.rundir.checkpoints import checkpoint_step, complete_checkpoints
from trainer.rundir.events import read_status

# children start exactly as a user's (plugins/zygote.py)
pytestmark = [pytest.mark.slow, pytest.mark.user_start]


def test_stop_then_resume_is_exact(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", tiny_config(training={"max_steps": 8}, checkpoints={"every_steps": 5}))
    full, part = tmp_path / "full", tmp_path / "part"
    assert cli("run", cfg, "--run-dir", full, "--quiet").returncode == 0
    proc = cli("run", cfg, "--run-dir", part, "--quiet", env={"TRAINPILOT_INJECT_STOP": "3"})
    assert proc.returncode == 0, proc.stderr
    assert read_status(part)["state"] == "stopped"
    assert events(part, "stopped")[-1]["step"] == 3, "the stop saves at the current step, not the last save"
    assert (part / "checkpoints" / "checkpoint-3").is_dir()
    proc = cli("resume", part, "--quiet")
    assert proc.returncode == 0, proc.stderr
    a, b = losses(full), losses(part)
    assert a.keys() == b.keys()
    for step in a:
        assert b[step] == pytest.approx(a[step], abs=1e-6), step
    wa, wb = final_weights(full), final_weights(part)
    assert all(torch.allclose(wa[n], wb[n], atol=1e-6) for n in wa)


def test_stop_command_from_another_terminal_saves_and_exits_zero(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", tiny_config(training={"max_steps": 400}, checkpoints={"every_steps": 1000}))
    run = tmp_path / "run"
    sup = subprocess.Popen([sys.executable, "-m", "trainer", "run", str(cfg), "--run-dir", str(run), "--quiet"],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: events(run, "step"), 120)
    assert cli("stop", run).returncode == 0
    out, err = sup.communicate(timeout=120)
    assert sup.returncode == 0, err
    stopped = events(run, "stopped")[-1]
    assert Path(stopped["checkpoint"]).name == f"checkpoint-{stopped['step']}"
    assert read_status(run)["state"] == "stopped"


def test_ctrl_c_is_a_graceful_stop(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", tiny_config(training={"max_steps": 400}, checkpoints={"every_steps": 1000}))
    run = tmp_path / "run"
    sup = subprocess.Popen([sys.executable, "-m", "trainer", "run", str(cfg), "--run-dir", str(run)], cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: events(run, "step"), 120)
    sup.send_signal(signal.SIGINT)
    out, err = sup.communicate(timeout=120)
    assert sup.returncode == 0, err
    assert events(run, "stopped") and complete_checkpoints(run / "checkpoints")


def test_kill_9_at_random_moments_never_loses_a_complete_checkpoint(tmp_path):
    # One long run killed 6 times; every third kill (the 1st and the 4th) lands inside a checkpoint save (slowed
    # down to hit it), the others at random moments of training.
    rng = random.Random(1234)
    cfg = write_config(tmp_path / "c.yaml", tiny_config(training={"max_steps": 40},
                                                        checkpoints={"every_steps": 3, "keep_last": 2}))
    run = tmp_path / "run"
    env = dict(os.environ, TRAINPILOT_INJECT_SLOW_SAVE="0.5")
    args = [sys.executable, "-m", "trainer", "run", str(cfg), "--run-dir", str(run), "--quiet"]
    for trial in range(6):
        starts = len(events(run, "run_started"))
        steps_before = len(events(run, "step"))
        expected = max((checkpoint_step(p) for p in complete_checkpoints(run / "checkpoints")), default=0)
        sup = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait_for(lambda: len(events(run, "step")) > steps_before, 120)
        started = events(run, "run_started")[starts]
        resumed = checkpoint_step(started["resume_from"]) if started["resume_from"] else 0
        assert resumed == expected, "resume must start from the newest complete checkpoint"
        if trial % 3 == 0:
            _wait_for(lambda: list((run / "checkpoints").glob(".staging-*")), 120)
            time.sleep(0.2)
        else:
            time.sleep(rng.uniform(0.0, 1.5))
        newest_at_kill = max((checkpoint_step(p) for p in complete_checkpoints(run / "checkpoints")), default=0)
        os.kill(read_status(run)["worker_pid"], signal.SIGKILL)
        out, err = sup.communicate(timeout=120)
        assert sup.returncode == 1, err
        assert "killed by signal 9" in err and "resume with" in err
        assert events(run, "failed")[-1]["log_tail"], "the failure carries the last log lines"
        newest = max((checkpoint_step(p) for p in complete_checkpoints(run / "checkpoints")), default=0)
        assert newest >= newest_at_kill, "a complete checkpoint was lost"
        last_logged = max(e["step"] for e in events(run, "step"))
        assert last_logged - newest <= 3, "lost more than the steps since the newest checkpoint"
        args = [sys.executable, "-m", "trainer", "resume", str(run), "--quiet"]
    proc = cli("resume", run, "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert read_status(run)["state"] == "finished"
    assert max(e["step"] for e in events(run, "step")) == 40
    assert not list((run / "checkpoints").glob(".staging-*"))


def test_oom_ladder_keeps_effective_batch_and_matches_direct_run(tmp_path):
    base = dict(training={"max_steps": 6, "micro_batch_size": 8, "gradient_accumulation_steps": 1,
                          "effective_batch_size": 8}, data={"packing": False, "seq_len": 64},
                checkpoints={"every_steps": 2},
                speed={"precision": "fp32", "gradient_checkpointing": False, "loss_kernel": "chunked"})  # no loss rung
    # the config sets the micro-batch; recovery.ladder_keeps: [] lets the ladder change it all the same
    cfg = write_config(tmp_path / "c.yaml", tiny_config(**base, recovery={"ladder_keeps": []}))
    run = tmp_path / "ladder"
    # OOM from step 3 on while micro-batch > 2: 8 → 4 (still OOM) → 2 (fits).
    proc = cli("run", cfg, "--run-dir", run, "--quiet", env={"TRAINPILOT_INJECT_OOM": "3:2"})
    assert proc.returncode == 0, proc.stderr
    retries = events(run, "retry")
    assert [r["changes"]["training.micro_batch_size"] for r in retries] == [4, 2]
    assert all(r["changes"]["training.micro_batch_size"] * r["changes"]["training.gradient_accumulation_steps"] == 8
               for r in retries)
    assert len(events(run, "oom")) == 2
    direct_cfg = write_config(tmp_path / "d.yaml", tiny_config(**dict(base, training=dict(
        base["training"], micro_batch_size=2, gradient_accumulation_steps=4))))
    direct = tmp_path / "direct"
    assert cli("run", direct_cfg, "--run-dir", direct, "--quiet").returncode == 0
    a, b = losses(direct), losses(run)
    assert a.keys() == b.keys()
    for step in a:
        assert b[step] == pytest.approx(a[step], abs=1e-5), step


def test_oom_ladder_exhausted_exits_3_with_a_report(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", tiny_config(training={"max_steps": 3, "micro_batch_size": 2,
                                                                  "gradient_accumulation_steps": 4},
                                                        recovery={"ladder_keeps": []}))  # may change all it sets
    run = tmp_path / "run"
    env = {"TRAINPILOT_INJECT_OOM": "1:0"}  # every micro-batch size OOMs
    proc = cli("run", cfg, "--run-dir", run, "--quiet", "--set", "recovery.oom_ladder=true", env=env)
    assert proc.returncode == 3, proc.stderr
    assert "out of memory after every recovery step" in proc.stderr and "LoRA" in proc.stderr
    assert "Traceback" not in proc.stderr
    changes = [r["changes"] for r in events(run, "retry")]
    assert {"speed.gradient_checkpointing": True} in changes


def _wait_for(pred, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("timed out waiting")
