"""One time model for every decision of a plan (issue 45): ``speed.optimizer_step`` gives the seconds of one
optimizer step — compute at its micro-batch's utilisation, the copies beside it, ZeRO-Offload's host step and
traffic, paged states, the exchange between cards — and checkpointing against activation offload, the tiled MLP
against paged states, the loss kernel and the card set all read it. The decisions over the hardware fixtures are
compared with the table made on main's code before the model was unified (tests/fixtures/plan_decisions.txt: each
line the model changed says why above it)."""
from __future__ import annotations

from dataclasses import replace

import pytest
from plan_decisions import CONFIGS, FIXTURES, HW, TABLE, config, decisions, fixed_environment, read_table

from trainer.hardware.source import open_probe
from trainer.models.spec import load_model_spec
from trainer.planning import flops, gpus, speed
from trainer.planning.context import make_setup
from trainer.planning.memory import TrainSetup, estimate
from trainer.planning.plan import plan_run

RTX3090 = "NVIDIA GeForce RTX 3090"
PCIE4_X16 = 16 * 1.969e9  # PCIe 4.0: 16 GT/s per lane after 128b/130b coding (probe.PCIE_LANE_BYTES_PER_SECOND)


def test_the_timed_decisions_on_the_fixtures_are_the_tables():
    expected = read_table(TABLE)
    got = decisions()
    assert set(got) == set(expected) == {(f, c) for f in FIXTURES for c in CONFIGS}
    differ = [f"{f} | {c}\n  table: {expected[(f, c)]}\n  now:   {got[(f, c)]}" for f, c in got
              if got[(f, c)] != expected[(f, c)]]
    assert not differ, "decisions differ from tests/fixtures/plan_decisions.txt:\n" + "\n".join(differ)


def _zero_offload(spec, world: int, micro: int = 4):
    s = TrainSetup(micro_batch=micro, seq_len=1024, deepspeed=True, zero_stage=2, offload_optimizer=True,
                   gradient_accumulation=16 // world // micro, gpus_per_node=world)
    return s, estimate(spec, s)


def test_zero_offload_pays_the_host_adam_step_and_its_traffic():
    """ZeRO-Offload on one card: CPU Adam over every trainable parameter on the host at DeepSpeed's measured rate,
    each micro-batch's gradients to the host and the updated 16-bit weights back over PCIe. Two ranks on one machine
    share its cores (the host's step stays the whole model's) and each moves half over its own link."""
    spec = load_model_spec("qwen3-1.7b")
    s, est = _zero_offload(spec, 1)
    one = speed.optimizer_step(spec, s, est, RTX3090, PCIE4_X16)
    n, p = s.gradient_accumulation, est.trainable_params
    assert one["host"] == pytest.approx(p / speed.CPU_ADAM_PARAMS_PER_SECOND)
    assert one["moved"] == n * p * 2 + p * 2  # gradients every micro-batch, the weights once, in 16 bits
    assert one["host_copies"] == pytest.approx(p * 2 / (PCIE4_X16 * speed.PCIE_EFFICIENCY))
    assert one["total"] == pytest.approx(one["micro_batches"] + one["host"] + one["host_copies"])
    s2, est2 = _zero_offload(spec, 2)
    two = speed.optimizer_step(spec, s2, est2, RTX3090, PCIE4_X16)
    assert two["host"] == pytest.approx(one["host"]) and two["host_copies"] == pytest.approx(one["host_copies"] / 2)
    assert two["exchange"] > 0  # ZeRO-2's reduce-scatter and all-gather between the ranks
    plain = speed.optimizer_step(spec, replace(s, deepspeed=False, offload_optimizer=False), est, RTX3090, PCIE4_X16)
    assert plain["host"] == plain["host_copies"] == 0 and plain["total"] < one["total"]


def test_the_fixed_cost_per_micro_batch_is_time_so_n_half_follows_the_cards_peak():
    """The H100 fit's n½ on a 3090 (71 of the H100's 989 TFLOP/s) is that fraction of it; at the fit's own point
    the H100 computes at MFU."""
    spec, s = load_model_spec("llama-3.2-1b"), TrainSetup(micro_batch=8, seq_len=2048)
    h100 = speed.peak_flops("NVIDIA H100 80GB HBM3")
    assert speed.half_busy(spec, s, h100) == pytest.approx(4096, rel=1e-3)
    assert speed.half_busy(spec, s, 71e12) == pytest.approx(4096 * 71e12 / h100, rel=1e-3)
    # the same micro-batch keeps the slower card busier: its share of the peak is larger there
    step = 8 * 2048 * flops.flops_per_token(spec, s)
    share = {peak: step / speed.compute_seconds(spec, s, peak) / peak for peak in (h100, 71e12)}
    assert share[h100] == pytest.approx(speed.MFU, rel=1e-3) and speed.MFU < share[71e12] < speed.SUSTAINED


def test_the_card_set_reads_the_host_step_two_3090s_shard_rather_than_offload():
    """The previous attempt at one model moved the 2× RTX 3090 Qwen3-1.7B full fine-tune onto one card with ZeRO-2
    offload, its CPU Adam step untimed. Timed, the one card pays it and both cards are kept with ZeRO-3."""
    with fixed_environment():
        plan = plan_run(config("qwen3-1.7b full fp32 1k"), open_probe(str(HW / "dual_rtx3090_24gb.jsonl")).snapshot(),
                        alternatives=False)
    s = plan.settings
    assert (s["deepspeed.zero_stage"], s["deepspeed.offload_optimizer"], s["distributed.num_gpus"]) == (3, False, 2)
    first = plan.reasons[0]
    one_card = first.split("; GPUs 0 + 1")[0]
    assert "s for the optimizer step on the host" in one_card and "<- planned" in first.split("; GPUs 0 + 1")[1]


def test_every_timed_reason_quotes_the_one_model():
    """The numbers the reasons give are ``optimizer_step``'s: checkpointing against offload on the laptop."""
    laptop = open_probe(str(HW / "rtx4090_laptop_16gb.jsonl")).snapshot()
    with fixed_environment():
        plan = plan_run(config("qwen2.5-0.5b full 8k"), laptop, alternatives=False)
    why = next(r for r in plan.reasons if r.startswith("gradient checkpointing on rather than activation offload"))
    ctx, choice = plan.ctx, plan.choice
    setup = make_setup(ctx, choice.micro, choice.ckpt, choice.ds, choice.offload, choice.optimizer)
    t = speed.optimizer_step(ctx.spec, setup, choice.estimate, ctx.gpu.name, ctx.gpu.pcie_bytes_per_second)
    assert f"checkpointing's recompute ≈ {t['total']:.2f} s per optimizer step (micro-batch {choice.micro})" in why
    assert gpus.step_time(plan, gpus.CardSet((ctx.gpu,)))["total"] == t["total"]  # the card set's time is the same
