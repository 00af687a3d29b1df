"""Which GPU a run trains on, and several GPUs planned (issue 47, docs/gpus.md): the recordings of machines with
several cards (written from published specs, tests/fixtures/hardware/make_spec_fixtures.py), the planner's choice
and its words, the key that picks cards, the worker's CUDA_VISIBLE_DEVICES seen by real child processes, and the
telemetry that follows the run's cards."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers_train import TRAIN_TIMEOUT, run_cli, write_demo_data, write_workspace_config

from trainer import config as C
from trainer.hardware.recording import ReplayProbe, read_recording, record
from trainer.launch import argv
from trainer.planning import gpus
from trainer.planning.plan import plan_run

HW = Path(__file__).parent / "fixtures" / "hardware"
MIXED = HW / "rtx3060_display_rtx3090.jsonl"  # GPU 0: RTX 3060 driving the display; GPU 1: RTX 3090
DUAL = HW / "dual_rtx3090_24gb.jsonl"
TRIPLE = HW / "triple_rtx5060ti_16gb.jsonl"
HYBRID = HW / "rtx4090_laptop_hybrid.jsonl"


def snap(path: Path):
    return ReplayProbe(path).snapshot()


def cfg(**dotted):
    base = {"model": {"source": "meta-llama/Llama-3.2-1B"}, "method": {"type": "lora"},
            "data": {"seq_len": 2048}, "training": {"effective_batch_size": 16}, "deepspeed": {"enabled": "auto"}}
    out = C.validate(base)
    return C.replace(out, **dotted) if dotted else out


def test_recordings_hold_every_card_with_nvml_uuids_and_round_trip(tmp_path):
    expected = {MIXED: ["NVIDIA GeForce RTX 3060", "NVIDIA GeForce RTX 3090"], DUAL: ["NVIDIA GeForce RTX 3090"] * 2,
                TRIPLE: ["NVIDIA GeForce RTX 5060 Ti"] * 3, HYBRID: ["NVIDIA GeForce RTX 4090 Laptop GPU"]}
    for path, names in expected.items():
        meta, snaps = read_recording(path)
        assert meta["kind"] == "from_published_specs" and meta["sources"]
        first = snaps[0]
        assert [g.name for g in first.gpus] == names and [g.index for g in first.gpus] == list(range(len(names)))
        uuids = [g.uuid for g in first.gpus]
        assert len(set(uuids)) == len(uuids)
        assert all(len(u) == 40 and u.startswith("GPU-") and [len(p) for p in u[4:].split("-")] == [8, 4, 4, 4, 12]
                   for u in uuids)
    assert "integrated GPU" in read_recording(HYBRID)[0]["description"]
    mixed = snap(MIXED)
    assert {p.name for p in mixed.gpus[0].processes} >= {"Xorg", "gnome-shell"}  # the display card
    t = [0.0]
    out = tmp_path / "rec.jsonl"
    record(ReplayProbe(MIXED), out, seconds=2, interval=1.0, clock=lambda: t[0],
           sleep=lambda s: t.__setitem__(0, t[0] + s))
    again = read_recording(out)[1][0]
    assert [(g.index, g.uuid, g.memory_used_bytes) for g in again.gpus] == \
        [(g.index, g.uuid, g.memory_used_bytes) for g in mixed.gpus]


def test_the_planner_plans_the_card_with_the_most_usable_memory_and_says_why():
    hw = snap(MIXED)
    plan = plan_run(cfg(), hw)
    r3090 = hw.gpus[1]
    assert plan.gpu == "NVIDIA GeForce RTX 3090" and [g["index"] for g in plan.gpus] == [1]
    assert plan.resolved.distributed.gpus == [r3090.uuid] and plan.settings["distributed.gpus"] == [r3090.uuid]
    words = " ".join(plan.reasons)
    assert "GPU 1 (NVIDIA GeForce RTX 3090) of this machine's 2: the card with the most usable memory" in words
    assert "GPU 0 (NVIDIA GeForce RTX 3060) has" in words and "drives the display" in words
    assert not any("plan uses GPU 0" in n for n in plan.notes)
    assert plan.budget_bytes > 20 * 2**30  # the 3090's budget, not the 3060's


def test_the_cli_plan_names_the_3090(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: {source: meta-llama/Llama-3.2-1B}\nmethod: {type: lora}\ndata: {seq_len: 2048}\n"
                    "training: {effective_batch_size: 16}\n")
    proc = run_cli(["plan", str(path), "--hardware", str(MIXED)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "GPU 1 (NVIDIA GeForce RTX 3090) of this machine's 2" in proc.stdout
    assert f'distributed.gpus = ["{snap(MIXED).gpus[1].uuid}"]' in proc.stdout


def test_distributed_gpus_picks_cards_by_index_or_uuid_and_records_uuids():
    hw = snap(MIXED)
    by_index = plan_run(cfg(**{"distributed.gpus": [0]}), hw)
    assert by_index.gpu == "NVIDIA GeForce RTX 3060" and by_index.resolved.distributed.gpus == [hw.gpus[0].uuid]
    assert by_index.budget_bytes < 11 * 2**30
    by_uuid = plan_run(cfg(**{"distributed.gpus": [hw.gpus[1].uuid]}), hw)
    assert by_uuid.gpu == "NVIDIA GeForce RTX 3090" and by_uuid.resolved.distributed.gpus == [hw.gpus[1].uuid]
    assert "distributed.gpus" not in by_uuid.settings  # yours, not the planner's


def test_the_list_sets_the_number_of_gpus_and_must_agree_with_it():
    assert C.validate({"distributed": {"gpus": [0, 1]}}).world_size == 2
    with pytest.raises(C.ConfigError, match="names 2 GPU"):
        C.validate({"distributed": {"gpus": [0, 1], "num_gpus": 3}})
    with pytest.raises(C.ConfigError, match="not a GPU index or UUID"):
        C.validate({"distributed": {"gpus": ["the big one"]}})
    with pytest.raises(C.ConfigError, match="twice"):
        C.validate({"distributed": {"gpus": [1, 1]}})


def test_two_3090s_shard_a_full_fine_tune_with_zero3_each_rank_planned():
    if not gpus_can_shard():
        pytest.skip("DeepSpeed is not installed: the planner plans no ZeRO")
    full = C.validate({"model": {"source": "Qwen/Qwen3-1.7B", "dtype": "float32"}, "method": {"type": "full"},
                       "data": {"seq_len": 1024}, "training": {"effective_batch_size": 16},
                       "deepspeed": {"enabled": "auto"}})
    hw = snap(DUAL)
    plan = plan_run(full, hw)
    s = plan.settings
    assert s["deepspeed.enabled"] is True and s["deepspeed.zero_stage"] == 3 and not s["deepspeed.offload_optimizer"]
    assert s["distributed.num_gpus"] == 2 and plan.resolved.distributed.gpus == [g.uuid for g in hw.gpus]
    assert plan.resolved.distributed.launcher == "deepspeed" and plan.verdict == "fits"
    assert [g["index"] for g in plan.gpus] == [0, 1]
    assert all(g["rank_peak_bytes"] <= g["budget_bytes"] for g in plan.gpus)
    words = " ".join(plan.reasons)
    assert "ZeRO-3 shards weights, gradients and optimizer states over 2 ranks: each rank's share is planned" in words
    assert "card sets planned: GPU 1 (NVIDIA GeForce RTX 3090)" in words and "<- planned" in words
    # host RAM is planned per machine: both ranks run their own runtime and load the weights themselves
    from trainer.planning.memory import RUNTIME_HOST_BYTES
    assert plan.host_breakdown["runtime"] == 2 * RUNTIME_HOST_BYTES
    assert plan.host_breakdown["loading"] == 2 * 2 * plan.ctx.spec.params
    # the effective batch stays exact over the ranks
    r = plan.resolved.training
    assert r.micro_batch_size * r.gradient_accumulation_steps * 2 == 16


def gpus_can_shard() -> bool:
    from trainer.core import capabilities
    return capabilities.installed("deepspeed")


def test_uneven_cards_the_smallest_binds_and_is_compared_with_leaving_it_out():
    hw = snap(MIXED)
    both = plan_run(cfg(**{"distributed.num_gpus": 2}), hw)
    words = " ".join(both.reasons)
    assert [g["index"] for g in both.gpus] == [0, 1]
    assert "the NVIDIA GeForce RTX 3060 (GPU 0) binds" in words
    assert "without the NVIDIA GeForce RTX 3060 (GPU 0), GPU 1 (NVIDIA GeForce RTX 3090)" in words
    assert "s per optimizer step" in words and "set distributed.gpus: [" in words
    assert both.budget_bytes < 11 * 2**30  # each rank planned against the 3060's budget
    auto = plan_run(cfg(), hw)  # left to the planner: the 3090 alone is faster than both with the 3060 binding
    first = auto.reasons[0]
    assert first.startswith("card sets planned: GPU 1 (NVIDIA GeForce RTX 3090)") and "GPUs 0 + 1" in first
    assert "RTX 3060 binds" in first and [g["index"] for g in auto.gpus] == [1]


def test_several_cards_are_kept_only_when_faster_and_the_batch_divides():
    plan = plan_run(cfg(), snap(TRIPLE))
    first = plan.reasons[0]
    assert "not planned, the effective batch 16 does not divide into 3 equal ranks" in first
    assert len(plan.gpus) == 2 and plan.resolved.distributed.num_gpus == 2  # DDP halves the step here
    t = plan.resolved.training
    assert t.micro_batch_size * t.gradient_accumulation_steps * 2 == 16
    options = [(None, type("P", (), {"verdict": "fits"})(), {"total": 10.0}),
               (None, type("P", (), {"verdict": "fits"})(), {"total": 9.5})]
    assert gpus.best(options) == 0  # 5% faster is not worth a second card
    options[1] = (None, options[1][1], {"total": 5.0})
    assert gpus.best(options) == 1


def test_one_gpu_machines_plan_as_before():
    plan = plan_run(cfg(), snap(HYBRID))  # the integrated GPU is not NVML's: one card, nothing to choose
    assert [g["index"] for g in plan.gpus] == [0] and not plan.reasons[0].startswith("card sets")
    assert plan.resolved.distributed.gpus == [snap(HYBRID).gpus[0].uuid]


def test_worker_env_names_exactly_the_run_cards_in_a_real_child():
    from trainer.supervisor.spawn import spawn_worker

    hw = snap(MIXED)
    resolved = plan_run(cfg(), hw).resolved
    code = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['CUDA_DEVICE_ORDER'])"
    proc = spawn_worker([sys.executable, "-c", code], cfg=resolved)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.decode().split() == [hw.gpus[1].uuid, "PCI_BUS_ID"]
    assert argv.visible_devices_env(C.validate({})) == {}  # 'auto' left in a hand-made config: every card


def test_a_launched_rank_sets_the_run_cards_again(monkeypatch):
    two = C.validate({"device": "cpu", "distributed": {"gpus": ["GPU-aaaa", "GPU-bbbb"]}})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # what the DeepSpeed launcher gives its ranks
    monkeypatch.setenv("RANK", "1")
    argv.rank_environment(two)
    import os
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "GPU-aaaa,GPU-bbbb"


def test_telemetry_follows_the_run_cards(tmp_path):
    from trainer.supervisor.supervise import Supervisor

    hw = snap(MIXED)
    sup = Supervisor(tmp_path, quiet=True, telemetry_probe=ReplayProbe(MIXED))
    sup.run_gpus = (hw.gpus[1].uuid,)
    sup._sample_telemetry()
    line = json.loads((tmp_path / "telemetry.jsonl").read_text().splitlines()[0])
    assert [(g["index"], g["name"]) for g in line["gpus"]] == [(1, "NVIDIA GeForce RTX 3090")]
    assert hw.only(("GPU-not-here",)) is hw  # a run planned on a recording, sampled elsewhere: every card


def test_the_run_worker_sees_only_the_chosen_card(tmp_path):
    """A real ``trainpilot-cli run`` on the recording (on the CPU: the CI machine has no GPU), distributed.gpus
    by index: the worker's own environment, reported in run_started, names the 3090 by UUID."""
    write_demo_data(tmp_path / "train.jsonl", 20)
    path = write_workspace_config(tmp_path, {"distributed.gpus": [1], "training.max_steps": 1})
    run = tmp_path / "runs" / "r"
    proc = run_cli(["run", str(path), "--hardware", str(MIXED), "--run-dir", str(run), "--quiet"], cwd=tmp_path,
                   timeout=TRAIN_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    uuid = snap(MIXED).gpus[1].uuid
    started = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()
               if '"run_started"' in line][-1]
    assert started["cuda_visible_devices"] == uuid
    assert C.load(run / "config.yaml").distributed.gpus == [uuid]
    assert f"CUDA_VISIBLE_DEVICES={uuid} " in (run / "train.log").read_text()


def test_a_run_folder_listing_a_card_this_machine_lacks_is_refused_before_start():
    """Resume (or run) of a config whose cards are not in this machine: Start refuses it naming the key (the worker
    would otherwise start with no GPU visible)."""
    from trainer.supervisor import preflight

    elsewhere = C.validate({"device": "cuda", "distributed": {"gpus": [snap(MIXED).gpus[0].uuid]}})
    problems = dict(preflight.machine_problems(elsewhere, snap(DUAL)))
    assert problems["distributed.gpus"].startswith("this machine has no GPU 'GPU-a469d2b2")
    assert "trainpilot-cli probe" in problems["distributed.gpus"]
    cpu = dict(preflight.machine_problems(C.replace(elsewhere, device="cpu"), snap(DUAL)))
    assert "distributed.gpus" not in cpu  # a CPU run does not use them
