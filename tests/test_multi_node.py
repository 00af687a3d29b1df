"""Several ranks supervised as one run, and several machines really started (issue 47 items 5 and 6).

Two "machines" on this one: two supervisors, each started by the exported ``launch_multi_node.sh`` with its own
``NODE_RANK`` and run folder, meet at 127.0.0.1 (torchrun's static rendezvous, a c10d TCP store on node 0; the
DeepSpeed launcher without ssh), gloo on the CPU, the tiny demo model. The two machines' one rank each at micro-batch
2 must train what one rank trains at micro-batch 4 over the same data order (fp32: equal within rounding).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from helpers_train import (
    CLI,
    RANKS_LOSS_TOLERANCE,
    REPO,
    assert_refused,
    cli,
    events,
    free_port,
    losses,
    run_cli,
    tiny_config,
    trained_losses,
    tree_digest,
    write_config,
    write_workspace_config,
)

from trainer.config import hostfile
from trainer.supervisor.ranks import RankWatch

STEPS = 3


def _geometry(micro: int) -> dict:
    return {"max_steps": STEPS, "effective_batch_size": 4, "micro_batch_size": micro, "gradient_accumulation_steps": 1}


def _export_two_machines(tmp_path: Path, **sections) -> Path:
    """A config for 2 machines × 1 rank × micro-batch 2 exported with its scripts, and the hostfile beside them."""
    out = tmp_path / "export"
    out.mkdir()
    (out / "hostfile").write_text("# two machines on this one\nnode-a slots=1\nnode-b slots=1\n")
    machines = {"num_gpus": 1, "num_nodes": 2, "hostfile": str(out / "hostfile")}
    cfg = write_config(tmp_path / "c.yaml", tiny_config(**{"training": _geometry(2), "distributed": machines, **sections}))
    proc = cli("export", cfg, "--to", out)
    assert proc.returncode == 0, proc.stderr
    return out


def _start_machines(out: Path, tmp_path: Path, launcher: str, env: dict | None = None) -> list[subprocess.Popen]:
    """Both machines' ``launch_multi_node.sh``, as a user starts it on each (NODE_RANK, MASTER_ADDR, MASTER_PORT,
    RUN_DIR, LAUNCHER)."""
    port = free_port()
    procs = []
    for node in (0, 1):
        node_env = {**os.environ, "PYTHONUNBUFFERED": "1", "NODE_RANK": str(node), "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port), "RUN_DIR": str(tmp_path / f"node{node}"), "LAUNCHER": launcher,
                    **(env or {})}
        procs.append(subprocess.Popen(["bash", str(out / "launch_multi_node.sh"), "--quiet"], cwd=REPO, env=node_env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def _wait(procs: list[subprocess.Popen], timeout: float = 400) -> list[tuple[int, str]]:
    deadline = time.monotonic() + timeout
    out = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        out.append((p.returncode, err))
    return out


def _one_rank_reference(tmp_path: Path, **sections) -> list[float]:
    return list(trained_losses(tmp_path, "ref", **{"training": _geometry(4), **sections}).values())


def _assert_two_machines_train_as_one(tmp_path: Path, launcher: str, **sections) -> None:
    out = _export_two_machines(tmp_path, **sections)
    procs = _start_machines(out, tmp_path, launcher)
    reference = _one_rank_reference(tmp_path, **sections)
    results = _wait(procs)
    for node, (rc, err) in enumerate(results):
        assert rc == 0, f"node {node}: exit {rc}\n{err[-3000:]}\n{(tmp_path / f'node{node}' / 'train.log').read_text()[-3000:]}"
    node0 = tmp_path / "node0"
    started = events(node0, "run_started")[-1]
    assert started["world_size"] == 2
    two = list(losses(node0).values())
    assert len(two) == STEPS and len(reference) == STEPS
    assert two == pytest.approx(reference, rel=RANKS_LOSS_TOLERANCE), (two, reference)
    finished = events(node0, "finished")[-1]
    if (sections.get("deepspeed") or {}).get("zero_stage") == 3:  # each rank holds other slices of the weights
        assert "ranks_weights_sha256" not in finished
    else:
        assert len(finished["ranks_weights_sha256"]) == 2 and finished["ranks_in_sync"] is True
    print(f"two machines ({launcher}) against one rank: max relative loss difference "
          f"{max(abs(a - b) / abs(b) for a, b in zip(two, reference)):.1e}")
    log1 = (tmp_path / "node1" / "train.log").read_text()
    assert "(local rank 0, node 1) of 2" in log1, "node 1 started rank 1"
    return node0


@pytest.mark.slow
def test_two_machines_through_torchrun_train_as_one_rank_at_twice_the_micro_batch(tmp_path):
    node0 = _assert_two_machines_train_as_one(tmp_path, "torchrun")
    log = (node0 / "train.log").read_text()
    assert "--nnodes 2 --node_rank 0 --master_addr 127.0.0.1" in log
    assert events(node0, "finished")[-1]["wrapped_model"] == "DistributedDataParallel"


@pytest.mark.slow
@pytest.mark.deepspeed
def test_two_machines_through_the_deepspeed_launcher_with_zero3_train_as_one_rank(tmp_path):
    """ZeRO-3 across the machines: every weight is gathered from both for each forward and backward (the stage that
    talks most across machines; ZeRO-2 over several ranks is held to one rank in test_ranks_equal)."""
    node0 = _assert_two_machines_train_as_one(tmp_path, "deepspeed",
                                              deepspeed={"enabled": True, "zero_stage": 3})
    log = (node0 / "train.log").read_text()
    assert "deepspeed.launcher.runner" in log and "--no_ssh --node_rank 0" in log
    assert json.loads((node0 / "ds_config.json").read_text())["zero_optimization"]["stage"] == 3


@pytest.mark.slow
@pytest.mark.user_start
def test_a_killed_rank_fails_the_run_naming_it_and_the_run_resumes(tmp_path):
    """Two ranks on this machine (torchrun); rank 1 is killed (SIGKILL) as step 3 begins, after checkpoint-2: the run
    is failed naming rank 1 and its signal (not rank 0, which torchrun then terminated), and resumes to the end."""
    cfg = write_config(tmp_path / "c.yaml", tiny_config(
        training={"max_steps": 4, "effective_batch_size": 4, "micro_batch_size": 2, "gradient_accumulation_steps": 1},
        distributed={"num_gpus": 2, "master_port": free_port()}, checkpoints={"every_steps": 2, "keep_last": 5}))
    run = tmp_path / "run"
    proc = cli("run", cfg, "--run-dir", run, "--quiet", env={"TRAINPILOT_INJECT_KILL_RANK": "1:3"})
    assert proc.returncode == 1, proc.stderr[-3000:]
    failed = events(run, "failed")[-1]
    assert failed["kind"] == "rank_died" and failed["rank"] == 1 and failed["local_rank"] == 1, failed
    assert failed["exit_code"] == -9 and failed["host"] == socket.gethostname() and failed["node_rank"] == 0
    assert failed["resume_from"].endswith("checkpoint-2")
    assert "rank 1 (local rank 1" in failed["message"] and "SIGKILL" in failed["message"]
    assert "rank 1" in proc.stderr and "resume with: trainpilot-cli resume" in proc.stderr
    status = cli("status", run, "--json")
    assert '"state": "failed"' in status.stdout
    resumed = cli("resume", run, "--quiet", env={"TRAINPILOT_INJECT_KILL_RANK": ""})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert events(run, "run_started")[-1]["resume_from"].endswith("checkpoint-2")
    assert [e["step"] for e in events(run, "step")][-2:] == [3, 4]
    assert events(run, "finished")[-1]["ranks_in_sync"] is True


def test_torchrun_failure_summary_names_the_killed_rank_not_the_terminated_one():
    """torchrun's summary (torch.distributed.elastic's ChildFailedError, its template) after rank 1 was killed and
    rank 0 terminated: the signal-killed rank wins, whichever torchrun saw first."""
    watch = RankWatch()
    lines = ["trainpilot rank 1 (local rank 1, node 1) of 2 on node-b: pid 4242", "=" * 40, "trainer.worker FAILED",
             "-" * 40, "Failures:", "[1]:", "  time      : 2026-12-03_07:00:00", "  host      : node-b",
             "  rank      : 1 (local_rank: 1)", "  exitcode  : -9 (pid: 4242)", "  error_file: <N/A>",
             "  traceback : Signal 9 (SIGKILL) received by PID 4242", "-" * 40, "Root Cause (first observed failure):",
             "[0]:", "  time      : 2026-12-03_07:00:00", "  host      : node-b", "  rank      : 0 (local_rank: 0)",
             "  exitcode  : -15 (pid: 4241)", "  error_file: <N/A>", "  traceback : Signal 15 (SIGTERM) received"]
    for line in lines:
        watch.feed(line)
    dead = watch.culprit()
    assert (dead.rank, dead.local_rank, dead.host, dead.exit_code, dead.node) == (1, 1, "node-b", -9, 1)
    assert dead.words() == "rank 1 (local rank 1 on node-b, node 1) was killed by signal 9 (SIGKILL)"
    only_root = RankWatch()
    for line in lines[:5] + ["  <NO_OTHER_FAILURES>", "Root Cause (first observed failure):", "[0]:",
                             "  host      : h", "  rank      : 3 (local_rank: 1)", "  exitcode  : 1 (pid: 9)"]:
        only_root.feed(line)
    assert only_root.culprit().rank == 3 and only_root.culprit().exit_code == 1


def test_hostfile_is_read_by_deepspeeds_rules():
    hosts = hostfile.parse("# the machines\n\n  node-a slots=2\nnode-b slots=2 # the second\n")
    assert [(h.name, h.slots, h.line) for h in hosts] == [("node-a", 2, 3), ("node-b", 2, 4)]
    for text, needle in (("node-a slots=1\nnode-b\n", "line 2"), ("node-a slots=1\nnode-a slots=1\n", "already on line 1"),
                         ("# nothing\n\n", "names no machine"), ("node-a slots=two\n", "line 1")):
        with pytest.raises(hostfile.HostfileError, match=needle):
            hostfile.parse(text)


def _bad_machines(ws: Path, hosts: str | None, changes: dict) -> subprocess.CompletedProcess:
    from helpers_train import write_demo_data

    write_demo_data(ws / "train.jsonl", 40)
    if hosts is not None:
        (ws / "hostfile").write_text(hosts)
    cfg = write_workspace_config(ws, {"distributed.num_nodes": 2, "distributed.hostfile": str(ws / "hostfile"),
                                      "training.gradient_accumulation_steps": 1, **changes})
    before = tree_digest(ws)
    proc = run_cli(["run", str(cfg)], cwd=ws)
    assert tree_digest(ws) == before, "nothing is written"
    return proc


@pytest.mark.parametrize("hosts, changes, needles", [
    ("node-a slots=1\nnode-b\n", {}, ("distributed.hostfile", "line 2", "hostname slots=N")),
    ("node-a slots=1\nnode-a slots=1\n", {}, ("distributed.hostfile", "node-a", "already on line 1")),
    ("# nobody\n", {}, ("distributed.hostfile", "names no machine")),
    ("node-a slots=1\n", {}, ("distributed.hostfile", "names 1 machine(s)", "num_nodes is 2")),
    ("node-a slots=2\nnode-b slots=2\n", {}, ("line 1", "slots=2", "num_gpus is 1")),
    (None, {}, ("distributed.hostfile", "not found")),
    ("node-a slots=1\nnode-b slots=1\n", {"distributed.node_rank": 2}, ("distributed.node_rank", "numbered 0 to 1")),
], ids=["unparsed-line", "duplicate-host", "no-hosts", "fewer-hosts", "slots-not-gpus", "missing", "node-rank"])
def test_bad_machines_are_refused_before_anything_starts(tmp_path, hosts, changes, needles):
    assert_refused(_bad_machines(tmp_path, hosts, changes), 2, needles)


def test_the_multi_node_script_refuses_to_start_without_node_rank(tmp_path):
    out = _export_two_machines(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "NODE_RANK"}
    proc = subprocess.run(["bash", str(out / "launch_multi_node.sh")], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "set NODE_RANK" in proc.stderr


@pytest.mark.slow
@pytest.mark.user_start
def test_a_killed_machine_fails_the_run_on_both_and_both_resume_to_the_uninterrupted_losses(tmp_path):
    """Two machines (torchrun, DDP); node 1's only rank is killed as step 3 begins, after checkpoint-2. Node 1's run
    names its rank and the signal; node 0's run fails too (its rank lost its peer), each machine holding its own whole
    checkpoint (save_on_each_node). Both resume from checkpoint-2 and end with the losses of one rank uninterrupted."""
    out = _export_two_machines(tmp_path, training={**_geometry(2), "max_steps": 4},
                               checkpoints={"every_steps": 2, "keep_last": 5})
    procs = _start_machines(out, tmp_path, "torchrun", env={"TRAINPILOT_INJECT_KILL_RANK": "1:3"})
    reference = _one_rank_reference(tmp_path, training={**_geometry(4), "max_steps": 4})
    results = _wait(procs)
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    assert [rc for rc, _ in results] == [1, 1], results
    dead = events(node1, "failed")[-1]
    assert (dead["kind"], dead["rank"], dead["node_rank"], dead["exit_code"]) == ("rank_died", 1, 1, -9), dead
    other = events(node0, "failed")[-1]
    assert other["kind"] == "rank_died" and other["rank"] == 0 and other["node_rank"] == 0, other
    assert "a rank on another machine may have died first" in other["message"]
    for node in (node0, node1):
        assert events(node, "failed")[-1]["resume_from"].endswith("checkpoint-2"), node
        assert (node / "checkpoints" / "checkpoint-2" / "model.safetensors").is_file(), "each machine's own checkpoint"
    resumes = [subprocess.Popen([*CLI, "resume", str(node), "--quiet"], cwd=REPO,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for node in (node0, node1)]
    for node, (rc, err) in zip((node0, node1), _wait(resumes)):
        assert rc == 0, f"{node.name}: exit {rc}\n{err[-3000:]}"
    assert events(node0, "run_started")[-1]["resume_from"].endswith("checkpoint-2")
    resumed = losses(node0)
    assert sorted(resumed) == [1, 2, 3, 4]
    assert [resumed[s] for s in (1, 2, 3, 4)] == pytest.approx(reference, rel=RANKS_LOSS_TOLERANCE), (resumed, reference)
