"""The OOM ladder walks issue 21's rungs in order of cost, the effective batch exact at every rung:
a loss without full logits → micro-batch → checkpointing → activation offload → 8-bit AdamW (if allowed) → optimizer
offload → parameter offload."""
from __future__ import annotations

import pytest

from helpers_train import cli, events, tiny_config, write_config
from trainer.core import capabilities
from trainer import config as C
from trainer.config.resolved import as_resolved
from trainer.planning import ladder


def _resolved(**over):
    data = {"device": "cuda", "plan_allow_approximate": True, "model": {"architecture": "llama-3.2-1b", "dtype": "bfloat16"},
            "training": {"effective_batch_size": 8, "micro_batch_size": 8, "gradient_accumulation_steps": 1},
            "speed": {"precision": "bf16", "gradient_checkpointing": False, "loss_kernel": "hf",
                      "activation_offload": False},
            "deepspeed": {"enabled": False}, "distributed": {"launcher": "single"},
            "grpo": {"generation_batch_size": 8}}  # resolved: no "auto" left (GRPO's only matters to GRPO)
    for k, v in over.items():
        data[k] = {**data.get(k, {}), **v} if isinstance(v, dict) else v
    return as_resolved(C.validate(data))


def _walk(cfg) -> list[dict]:
    steps = []
    while (step := ladder.next_step(cfg)) is not None:
        steps.append(step.changes)
        cfg = step.config
        t = cfg.training
        assert t.micro_batch_size * t.gradient_accumulation_steps == t.effective_batch_size == 8
    return steps


def test_the_gpu_ladder_walks_every_rung_in_order_of_cost():
    if not capabilities.installed("deepspeed"):  # found, not imported (importing DeepSpeed takes seconds)
        pytest.skip("the offload rungs need DeepSpeed installed")
    steps = _walk(_resolved())
    assert steps == [
        {"speed.loss_kernel": "liger" if capabilities.installed("liger-kernel") else "chunked"},
        {"training.micro_batch_size": 4, "training.gradient_accumulation_steps": 2},
        {"training.micro_batch_size": 2, "training.gradient_accumulation_steps": 4},
        {"training.micro_batch_size": 1, "training.gradient_accumulation_steps": 8},
        {"speed.gradient_checkpointing": True},
        {"speed.activation_offload": True},
        # 8-bit AdamW only where bitsandbytes is installed: the rung must be able to run on this machine
        *([{"training.optimizer": "adamw_8bit"}] if capabilities.installed("bitsandbytes") else []),
        {"deepspeed.enabled": True, "deepspeed.zero_stage": 2, "deepspeed.offload_optimizer": True},
        {"deepspeed.zero_stage": 3, "deepspeed.offload_params": True},
    ]


def test_without_approximate_savings_the_8bit_rung_is_skipped_and_the_cpu_has_no_gpu_rungs():
    strict = [list(s) for s in _walk(_resolved(plan_allow_approximate=False))]
    assert ["training.optimizer"] not in strict and ["speed.activation_offload"] in strict
    cpu = _walk(_resolved(device="cpu", speed={"precision": "fp32"}, model={"dtype": "float32"}))
    assert {"speed.activation_offload": True} not in cpu and {"training.optimizer": "adamw_8bit"} not in cpu
    assert cpu[0] == {"speed.loss_kernel": "chunked"}  # Liger's kernels need CUDA


def test_no_loss_rung_where_no_kernel_is_exact():
    gpt2 = _walk(_resolved(model={"architecture": "gpt2"}))
    assert not [s for s in gpt2 if "speed.loss_kernel" in s]
    dpo = _walk(_resolved(training={"objective": "dpo"}))
    assert not [s for s in dpo if "speed.loss_kernel" in s]
    gemma = _walk(_resolved(model={"architecture": "gemma-2-2b", "dtype": "float32", "attn_implementation": "eager"},
                            device="cpu", speed={"precision": "fp32"}))
    assert gemma[0] == {"speed.loss_kernel": "chunked"}  # soft-capped logits: exact since the chunked loss soft-caps


@pytest.mark.slow
def test_injected_oom_climbs_chunked_loss_first_then_micro_batch(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", tiny_config(
        training={"max_steps": 4, "micro_batch_size": 8, "gradient_accumulation_steps": 1, "effective_batch_size": 8},
        data={"packing": False, "seq_len": 64}, speed={"loss_kernel": "hf"}))
    run = tmp_path / "ladder"
    # OOM from step 2 while HF's full-logits loss runs or the micro-batch is above 2
    proc = cli("run", cfg, "--run-dir", run, "--quiet", env={"TRAINPILOT_INJECT_OOM": "2:2:chunked"})
    assert proc.returncode == 0, proc.stderr
    changes = [r["changes"] for r in events(run, "retry")]
    assert changes == [{"speed.loss_kernel": "chunked"},
                       {"training.micro_batch_size": 4, "training.gradient_accumulation_steps": 2},
                       {"training.micro_batch_size": 2, "training.gradient_accumulation_steps": 4}]
    assert [e["loss_kernel"] for e in events(run, "run_started")] == ["hf", "chunked", "chunked", "chunked"]
    assert max(e["step"] for e in events(run, "step")) == 4
