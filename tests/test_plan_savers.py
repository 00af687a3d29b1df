"""The planner knows the memory savers of issue 21: the chunked loss (exact; chosen where it lets the run fit or
run faster: planning/loss_kernel.py, tests/test_loss_kernel.py), activation offload (CUDA, with its host RAM and
PCIe cost), 8-bit AdamW (only when approximate savings are allowed), each a component of the plan with "without
it it would need Y"."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer import config as C
from trainer.core.units import GIB
from trainer.hardware.source import open_probe
from trainer.planning.speed import PCIE_EFFICIENCY
from trainer.planning.memory import loss_chunk_tokens
from trainer.planning.plan import plan_run

FIX = Path(__file__).parent / "fixtures" / "hardware"


def hw(name):
    return open_probe(str(FIX / f"{name}.jsonl")).snapshot()


def cfg(arch, approximate=False, **sections):
    data = {"model": {"architecture": arch}, "data": {"seq_len": 1024}, "training": {"effective_batch_size": 16},
            "plan_allow_approximate": approximate}
    for k, v in sections.items():
        data.setdefault(k, {}).update(v)
    return C.validate(data)


def test_qwen_half_b_full_finetune_on_the_laptop_gets_a_bigger_micro_batch():
    before = plan_run(cfg("qwen2.5-0.5b", speed={"loss_kernel": "hf"}), hw("rtx4090_laptop_16gb"))
    after = plan_run(cfg("qwen2.5-0.5b"), hw("rtx4090_laptop_16gb"))
    assert before.breakdown["logits_loss"] > 2 * GIB  # HF's loss: 8 bytes per logit beside the log-softmax
    # one chunk of 440 tokens × 151,936 logits (8 bytes each) and the head's 16-bit weight gradient
    assert after.breakdown["logits_loss"] == 8 * 440 * 151_936 + 2 * 151_936 * 896
    assert after.resolved.speed.loss_kernel == "chunked" and before.resolved.speed.loss_kernel == "hf"
    b, a = before.resolved.training, after.resolved.training
    assert a.micro_batch_size > b.micro_batch_size
    assert a.micro_batch_size * a.gradient_accumulation_steps == b.micro_batch_size * b.gradient_accumulation_steps == 16
    row = next(r for r in after.savings if r["saver"] == "chunked_loss")
    assert row["without_bytes"] - row["saves_bytes"] == after.predicted_peak_bytes
    assert any(r.startswith("chunked loss (exact): saves") and "without it this would need" in r for r in after.reasons)
    assert json.loads(json.dumps(after.to_dict()))["savings"][0]["saver"] == "chunked_loss"


def test_chunked_loss_is_one_chunk_of_logits():
    assert loss_chunk_tokens(151_936) == 440 and loss_chunk_tokens(128_256) == 520
    assert loss_chunk_tokens(1024) == 65536  # the demo: one chunk holds any micro-batch


def test_auto_keeps_hf_loss_where_chunking_is_not_exact():
    gpt2 = plan_run(cfg("gpt2", data={"seq_len": 1024}), hw("rtx4090_laptop_16gb"))
    assert gpt2.resolved.speed.loss_kernel == "hf"  # its decoder is not model.model: the chunked loss cannot replace it
    dpo = plan_run(cfg("qwen2.5-0.5b", training={"objective": "dpo", "effective_batch_size": 16}), hw("desktop_24gb"))
    assert dpo.resolved.speed.loss_kernel == "hf"  # TRL scores its own log-probs in tiles


def test_cpu_plans_resolve_every_new_auto():
    plan = plan_run(cfg("demo-tiny-llama"), hw("no_gpu"))
    assert plan.resolved.speed.loss_kernel == "hf" and plan.resolved.speed.activation_offload is False
    assert plan.resolved.training.optimizer == "adamw"


def test_eight_bit_adamw_only_when_approximate_savings_are_allowed():
    base = dict(data={"seq_len": 4096}, speed={"gradient_checkpointing": True, "activation_offload": False})
    strict = plan_run(cfg("llama-3.2-3b", **base), hw("desktop_24gb"))
    loose = plan_run(cfg("llama-3.2-3b", approximate=True, **base), hw("desktop_24gb"))
    assert strict.resolved.training.optimizer == "adamw"
    assert loose.resolved.training.optimizer == "adamw_8bit" and loose.resolved.deepspeed.enabled is False
    row = next(r for r in loose.savings if r["saver"] == "optimizer_8bit")
    assert row["saves_bytes"] > 0
    assert any("numerics change" in r for r in loose.reasons)


def test_activation_offload_is_chosen_before_deepspeed_with_its_host_ram_and_pcie_cost():
    # the tiled MLP off: with it this run fits without offload (test_long_context_plan.py)
    plan = plan_run(cfg("llama-3.2-1b", data={"seq_len": 8192}, speed={"gradient_checkpointing": False,
                                                                       "tiled_mlp": False},
                        deepspeed={"enabled": "auto"}), hw("desktop_24gb"))
    r = plan.resolved
    assert plan.verdict == "fits" and r.speed.activation_offload is True and r.deepspeed.enabled is False
    row = next(x for x in plan.savings if x["saver"] == "activation_offload")
    assert row["host_ram_bytes"] == plan.host_breakdown["offloaded_activations"] > 0
    steps = 16 // r.training.micro_batch_size
    assert row["pcie_bytes_per_step"] == 2 * row["host_ram_bytes"] * steps
    # PCIe 4.0 x16 at the fitted share of its rate: the one PCIe time (planning.speed.pcie_seconds)
    assert row["pcie_seconds_per_step"] == round(row["pcie_bytes_per_step"] / (1.969e9 * 16 * PCIE_EFFICIENCY), 3)
    assert any("activation offload: saves" in x and "an estimate" in x for x in plan.reasons)


def test_activation_offload_without_a_pcie_reading_gives_no_seconds():
    h100 = open_probe(str(FIX / "h100_training.jsonl")).snapshot()  # a real recording from before the PCIe fields
    assert h100.gpus[0].pcie_bytes_per_second is None
    # (llama-3.1-8b at 16384 tokens offloaded here before issue 31: what TRL's offload keeps on the GPU no longer fits)
    plan = plan_run(cfg("llama-3.2-3b", data={"seq_len": 16384}, speed={"gradient_checkpointing": False,
                                                                        "tiled_mlp": False}), h100)
    row = next((x for x in plan.savings if x["saver"] == "activation_offload"), None)
    assert row is not None and row["pcie_seconds_per_step"] is None and row["pcie_bytes_per_step"] > 0


@pytest.mark.slow
def test_activation_offload_on_the_cpu_is_bad_input(tmp_path):
    from helpers_train import cli, tiny_config, write_config

    path = write_config(tmp_path / "c.yaml", tiny_config(training={"max_steps": 2}, speed={"activation_offload": True}))
    proc = cli("run", path, "--run-dir", tmp_path / "run", "--quiet")
    assert proc.returncode == 2 and "speed.activation_offload" in proc.stderr and "Traceback" not in proc.stderr
