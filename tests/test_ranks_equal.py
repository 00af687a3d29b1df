"""Several ranks on one machine train what one rank trains at the same effective batch (issue 47, "Done means"), and
a run resumed on another number of ranks keeps the effective batch and the losses of an uninterrupted run.

Why the losses can be equal, not merely close: the training order is the data's own sampler (``blocks.BlockOrder``,
seeded, the same whatever the world size), and accelerate hands its batches of ``micro_batch_size`` out to the ranks
in turn (``BatchSamplerShard``: rank r takes batches r, r + N, r + 2N…). With accumulation A on N ranks, optimizer
step s trains batches s·A·N … (s+1)·A·N − 1 over all ranks together: exactly the batches one rank trains at
accumulation A·N with the same micro-batch. The packed demo data has no padding, so the mean over tokens and the
mean over micro-batches agree, and HF's logged loss (averaged over the ranks) is the step's mean loss on both sides.
What is left is fp32 rounding: gloo's sum of N partial gradients against one rank's running sum.

CPU, gloo, the bundled tiny model, three steps: 2 and 3 ranks (distributed.num_gpus) through torchrun (DDP) and the
DeepSpeed launcher (ZeRO-2, ZeRO-3), each against one rank of the same engine.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from helpers_train import (
    PREFLIGHT_TIMEOUT,
    RANKS_LOSS_TOLERANCE,
    assert_refused,
    cli,
    events,
    free_port,
    losses,
    needs_deepspeed,
    tiny_config,
    trained_losses,
    tree_digest,
    write_config,
)

STEPS = 3
EFFECTIVE = 12  # divisible by micro-batch 2 × 1, 2 and 3 ranks
MICRO = 2
ENGINES = {"ddp": {"enabled": False}, "zero2": {"enabled": True, "zero_stage": 2},
           "zero3": {"enabled": True, "zero_stage": 3}}


def _geometry(ranks: int, steps: int = STEPS, effective: int = EFFECTIVE) -> dict:
    return {"max_steps": steps, "effective_batch_size": effective, "micro_batch_size": MICRO,
            "gradient_accumulation_steps": effective // (MICRO * ranks)}


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    """Per engine, one rank's losses at the effective batch (micro-batch 2 × accumulation 6), trained once."""
    folder = tmp_path_factory.mktemp("one-rank")
    cache: dict[str, dict[int, float]] = {}

    def reference(engine: str) -> dict[int, float]:
        if engine not in cache:
            cache[engine] = trained_losses(folder, engine, training=_geometry(1), deepspeed=ENGINES[engine])
        return cache[engine]
    return reference


@pytest.mark.slow
@pytest.mark.parametrize("engine", [
    "ddp",
    pytest.param("zero2", marks=[pytest.mark.deepspeed, needs_deepspeed]),
    pytest.param("zero3", marks=[pytest.mark.deepspeed, needs_deepspeed]),
])
@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_on_one_machine_train_as_one_rank_at_the_same_effective_batch(tmp_path, one_rank, engine, ranks):
    cfg = write_config(tmp_path / "c.yaml", tiny_config(training=_geometry(ranks), deepspeed=ENGINES[engine],
                                                        distributed={"num_gpus": ranks, "master_port": free_port()}))
    run = tmp_path / "run"
    proc = cli("run", cfg, "--run-dir", run, "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:] + (run / "train.log").read_text()[-3000:]
    assert events(run, "run_started")[-1]["world_size"] == ranks
    steps = events(run, "step")
    assert {(e["micro_batch_size"], e["gradient_accumulation_steps"]) for e in steps} == {(MICRO, EFFECTIVE // (MICRO * ranks))}
    finished = events(run, "finished")[-1]
    if engine != "zero3":  # ZeRO-3's ranks each hold a shard of the weights: there is no whole copy per rank to compare
        assert len(finished["ranks_weights_sha256"]) == ranks and finished["ranks_in_sync"] is True
    if engine == "ddp":
        assert finished["wrapped_model"] == "DistributedDataParallel"
    else:
        assert json.loads((run / "ds_config.json").read_text())["zero_optimization"]["stage"] == ENGINES[engine]["zero_stage"]
    got, reference = losses(run), one_rank(engine)
    assert sorted(got) == sorted(reference) == list(range(1, STEPS + 1))
    assert [got[s] for s in sorted(got)] == pytest.approx([reference[s] for s in sorted(reference)],
                                                          rel=RANKS_LOSS_TOLERANCE), (got, reference)


def _stopped_on_two_ranks(tmp_path, engine: str) -> tuple[Path, dict[int, float]]:
    """A 4-step run on 2 ranks (micro-batch 2 × accumulation 2 × 2 = 8) stopped at its step-2 checkpoint, and the
    losses of one rank trained uninterrupted at effective batch 8 (micro-batch 2 × accumulation 4)."""
    geometry = {**_geometry(2, steps=4, effective=8)}
    cfg = write_config(tmp_path / "c.yaml", tiny_config(training=geometry, deepspeed=ENGINES[engine],
                                                        checkpoints={"every_steps": 2, "keep_last": 5},
                                                        distributed={"num_gpus": 2, "master_port": free_port()}))
    run = tmp_path / "run"
    proc = cli("run", cfg, "--run-dir", run, "--quiet", env={"TRAINPILOT_INJECT_STOP": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:] + (run / "train.log").read_text()[-3000:]
    assert events(run, "stopped")[-1]["step"] == 2 and (run / "checkpoints" / "checkpoint-2").is_dir()
    reference = trained_losses(tmp_path, "one", training=_geometry(1, steps=4, effective=8), deepspeed=ENGINES[engine])
    return run, reference


def _assert_resumed_on_one_rank(run: Path, reference: dict[int, float]) -> dict:
    """``resume --set distributed.num_gpus=1``: it says what changed, trains accumulation 4 at micro-batch 2, and its
    losses (before the stop and after the resume) are the uninterrupted run's. Returns the resumed run_started."""
    proc = cli("resume", run, "--set", "distributed.num_gpus=1")
    assert proc.returncode == 0, proc.stderr[-3000:] + (run / "train.log").read_text()[-3000:]
    message = "resumed on 1 GPU (was 2): accumulation 2 → 4, effective batch 8 kept"
    assert message in proc.stdout and f"trainpilot: {message}" in (run / "train.log").read_text()
    started = events(run, "run_started")[-1]
    assert started["world_size"] == 1 and started["resume_from"].endswith("checkpoint-2")
    assert started["ranks_change"]["message"] == message and started["ranks_change"]["kept"] is True
    resumed = [e for e in events(run, "step") if e["step"] > 2]
    assert [(e["step"], e["micro_batch_size"], e["gradient_accumulation_steps"]) for e in resumed] == [(3, 2, 4), (4, 2, 4)]
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert (saved["distributed"]["num_gpus"], saved["training"]["gradient_accumulation_steps"]) == (1, 4)
    got = losses(run)
    assert sorted(got) == [1, 2, 3, 4]
    assert [got[s] for s in (1, 2, 3, 4)] == pytest.approx([reference[s] for s in (1, 2, 3, 4)],
                                                           rel=RANKS_LOSS_TOLERANCE), (got, reference)
    return started


@pytest.mark.slow
@pytest.mark.user_start
def test_a_run_stopped_on_two_ranks_resumes_on_one_with_the_effective_batch_and_losses_of_one_rank(tmp_path):
    """DDP (torchrun) → one process: HF's ``optimizer.pt`` holds every state (rank 0 wrote it), its data position
    counts micro-batches (2 steps × accumulation 4 on one rank = 2 steps × 2 × 2 on two). A resume that cannot keep
    the effective batch, or that would change what the checkpoint trained, is refused first, the run folder as it was."""
    run, reference = _stopped_on_two_ranks(tmp_path, "ddp")
    before = tree_digest(run)
    for change, needles in (("distributed.num_gpus=3", ("effective batch 8 cannot be kept on 3 GPU(s)", "1 or 2 or 4")),
                            ("training.learning_rate=1e-2", ("resume --set training.learning_rate", "start a new run"))):
        assert_refused(cli("resume", run, "--set", change, timeout=PREFLIGHT_TIMEOUT), 2, needles)
        assert tree_digest(run) == before, change
    started = _assert_resumed_on_one_rank(run, reference)
    assert started["engine_change"] is None  # the library's own resume
    assert events(run, "finished")[-1]["wrapped_model"] != "DistributedDataParallel"


@pytest.mark.slow
@pytest.mark.user_start
@pytest.mark.deepspeed
@needs_deepspeed
@pytest.mark.parametrize("engine", ["zero2", "zero3"])
def test_a_zero_run_stopped_on_two_ranks_resumes_on_one_through_deepspeeds_universal_checkpoint(tmp_path, engine):
    """ZeRO writes each rank's partition, which DeepSpeed's own loader reads back only on as many ranks: the resume
    goes through the engine switch (DeepSpeed's ``ds_to_universal``: per-parameter fp32 masters and AdamW moments, any
    number of ranks) and says so. The ZeRO-3 checkpoint's marker is made as old as before it recorded the number of
    ranks: the ranks are read off ZeRO's own per-rank partitions instead (``checkpoints.saved_ranks``)."""
    run, reference = _stopped_on_two_ranks(tmp_path, engine)
    if engine == "zero3":
        marker = run / "checkpoints" / "checkpoint-2" / "trainpilot_checkpoint.json"
        old = {k: v for k, v in json.loads(marker.read_text()).items() if k != "world_size"}
        marker.write_text(json.dumps(old))
    started = _assert_resumed_on_one_rank(run, reference)
    stage = ENGINES[engine]["zero_stage"]
    assert (started["engine_change"]["from"], started["engine_change"]["to"]) == (
        f"DeepSpeed ZeRO-{stage} (AdamW) on 2 GPUs", f"DeepSpeed ZeRO-{stage} (AdamW) on 1 GPU")
    assert "AdamW moments and step count (per parameter)" in started["engine_change"]["carried"]


def test_a_resume_elsewhere_splits_the_effective_batch_anew_and_lets_the_planner_pick_the_cards(tmp_path):
    """``create.resume_config`` on a run folder's config.yaml (no training): the accumulation follows the number of
    ranks, a micro-batch set follows too; two recorded cards give way to 'auto' on one GPU, and a list of cards sets
    the count; what a resume may not change is refused, naming the key."""
    from trainer import config as config_mod
    from trainer.core.errors import UserError
    from trainer.supervisor.create import resume_config

    cards = ["GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000"]
    saved = config_mod.validate(tiny_config(device="cuda", training=_geometry(2, effective=16),
                                            distributed={"num_gpus": 2, "gpus": cards}))
    (tmp_path / "config.yaml").write_text(config_mod.dump_yaml(saved))

    def split(*changes):
        cfg = resume_config(tmp_path, list(changes))
        return cfg.distributed.num_gpus, cfg.distributed.gpus, cfg.training.micro_batch_size, \
            cfg.training.gradient_accumulation_steps, cfg.training.effective_batch_size

    assert split() == (2, cards, 2, 4, 16)
    assert split("distributed.num_gpus=1") == (1, "auto", 2, 8, 16)
    assert split("distributed.num_gpus=4") == (4, "auto", 2, 2, 16)
    assert split("distributed.num_gpus=1", "training.micro_batch_size=4") == (1, "auto", 4, 4, 16)
    assert split(f"distributed.gpus=[{cards[1]}]") == (1, [cards[1]], 2, 8, 16)
    # a run planned on one GPU recorded one process (launcher: single): on two the planner picks the launcher again
    one = tmp_path / "one"
    one.mkdir()
    (one / "config.yaml").write_text(config_mod.dump_yaml(config_mod.validate(tiny_config(
        training=_geometry(1, effective=16), distributed={"num_gpus": 1, "launcher": "single"}))))
    assert resume_config(one, ["distributed.num_gpus=2"]).distributed.launcher == "auto"
    assert resume_config(one, []).distributed.launcher == "single"
    # a split run resumed on another number of cards: its layer counts give way to the planner's split
    split_run = tmp_path / "split"
    split_run.mkdir()
    (split_run / "config.yaml").write_text(config_mod.dump_yaml(config_mod.validate(tiny_config(
        method={"type": "lora"}, training=_geometry(1, effective=16),
        distributed={"num_gpus": 2, "layer_split": True, "layers_per_gpu": [1, 1]}))))
    moved = resume_config(split_run, ["distributed.num_gpus=3"])
    assert moved.distributed.layers_per_gpu == "auto" and moved.training.gradient_accumulation_steps == 8  # one rank
    for changes, needle in ((["distributed.num_gpus=3"], "cannot be kept on 3 GPU(s) at micro-batch 2"),
                            (["training.effective_batch_size=32"], "resume --set training.effective_batch_size"),
                            (["model.source=gpt2"], "start a new run")):
        with pytest.raises(UserError, match=re.escape(needle)):
            resume_config(tmp_path, changes)


@pytest.mark.slow
def test_a_run_resumed_onto_more_ranks_stops_on_all_when_one_asks_and_keeps_the_losses_of_one_rank(tmp_path):
    """A 1-rank run stopped at step 2 resumes on 2 ranks (the accumulation halves, the effective batch stays); there
    only rank 1 asks to stop (as a signal to one rank would), at step 3: both ranks stop at that step and write one
    complete checkpoint (one optimizer file, each rank's random state), from which the run finishes on 2 ranks —
    every step's loss the one-rank uninterrupted run's."""
    geometry = _geometry(1, steps=4, effective=8)
    cfg = write_config(tmp_path / "c.yaml", tiny_config(training=geometry, deepspeed=ENGINES["ddp"],
                                                        checkpoints={"every_steps": 10, "keep_last": 5},
                                                        distributed={"num_gpus": 1, "master_port": free_port()}))
    run = tmp_path / "run"
    proc = cli("run", cfg, "--run-dir", run, "--quiet", env={"TRAINPILOT_INJECT_STOP": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:] + (run / "train.log").read_text()[-3000:]
    assert events(run, "stopped")[-1]["step"] == 2
    proc = cli("resume", run, "--set", "distributed.num_gpus=2", env={"TRAINPILOT_INJECT_STOP": "3:1"})
    assert proc.returncode == 0, proc.stderr[-3000:] + (run / "train.log").read_text()[-3000:]
    message = "resumed on 2 GPUs (was 1): accumulation 4 → 2, effective batch 8 kept"
    assert message in proc.stdout, proc.stdout
    assert events(run, "run_started")[-1]["world_size"] == 2
    assert events(run, "stopped")[-1]["step"] == 3  # rank 0 stopped at rank 1's step, not later
    assert [e["source"] for e in events(run, "stop_requested")][-1] == "another rank"  # rank 0 speaks for the run
    ckpt = run / "checkpoints" / "checkpoint-3"
    assert ckpt.is_dir() and (ckpt / "optimizer.pt").is_file()
    assert {p.name for p in ckpt.glob("rng_state_*.pth")} == {"rng_state_0.pth", "rng_state_1.pth"}
    proc = cli("resume", run)
    assert proc.returncode == 0, proc.stderr[-3000:] + (run / "train.log").read_text()[-3000:]
    assert events(run, "run_started")[-1]["world_size"] == 2
    assert events(run, "run_started")[-1]["resume_from"].endswith("checkpoint-3")
    reference = trained_losses(tmp_path, "one", training=geometry, deepspeed=ENGINES["ddp"])
    got = losses(run)
    assert sorted(got) == [1, 2, 3, 4]
    assert [got[s] for s in (1, 2, 3, 4)] == pytest.approx([reference[s] for s in (1, 2, 3, 4)],
                                                           rel=RANKS_LOSS_TOLERANCE), (got, reference)
