"""Several ranks on one machine train what one rank trains at the same effective batch (issue 47, "Done means").

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

import pytest
from helpers_train import (
    RANKS_LOSS_TOLERANCE,
    cli,
    events,
    free_port,
    losses,
    needs_deepspeed,
    tiny_config,
    trained_losses,
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

