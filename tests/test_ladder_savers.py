"""The OOM ladder walks issue 21's rungs in order of cost, the effective batch exact at every rung:
a loss without full logits → micro-batch → checkpointing → activation offload → 8-bit AdamW (if allowed) → the
optimizer step fused into backward → optimizer offload → parameter offload; and it never changes a setting the user
chose (issue 29): every rung asks ``recovery.ladder_keeps``, which the planner resolves to the settings the config
gives a value."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers_train import cli, events, tiny_config, write_config
from trainer.core import capabilities
from trainer import config as C
from trainer.config.resolved import as_resolved
from trainer.core.dotted import get_in
from trainer.planning import ladder

LAPTOP = Path(__file__).parent / "fixtures" / "hardware" / "rtx4090_laptop_16gb.jsonl"
pytestmark = pytest.mark.user_start  # children start exactly as a user's (plugins/zygote.py)


def _resolved(**over):
    data = {"device": "cuda", "plan_allow_approximate": True, "model": {"architecture": "llama-3.2-1b", "dtype": "bfloat16"},
            "training": {"effective_batch_size": 8, "micro_batch_size": 8, "gradient_accumulation_steps": 1},
            "speed": {"precision": "bf16", "gradient_checkpointing": False, "loss_kernel": "hf",
                      "activation_offload": False, "tiled_mlp": False}, "method": {"lora_dropout": 0.05},
            "deepspeed": {"enabled": False}, "distributed": {"launcher": "single"},
            "grpo": {"generation_batch_size": 8},  # resolved: no "auto" left (GRPO's only matters to GRPO)
            "recovery": {"ladder_keeps": []}}  # as the planner resolves it when the user chose none of these
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
        {"speed.tiled_mlp": True},
        {"speed.activation_offload": True},
        # 8-bit AdamW only where bitsandbytes is installed: the rung must be able to run on this machine
        *([{"training.optimizer": "adamw_8bit"}] if capabilities.installed("bitsandbytes") else []),
        # issue 39: the step fused into backward (no gradient buffer), the whole batch in one micro-batch
        {"training.optimizer_in_backward": True, "training.micro_batch_size": 8,
         "training.gradient_accumulation_steps": 1, "training.max_grad_norm": 0.0},
        # DeepSpeed runs its own step: the fused one goes, and the micro-batch comes down again
        {"deepspeed.enabled": True, "deepspeed.zero_stage": 2, "deepspeed.offload_optimizer": True,
         "training.optimizer_in_backward": False},
        {"training.micro_batch_size": 4, "training.gradient_accumulation_steps": 2},
        {"training.micro_batch_size": 2, "training.gradient_accumulation_steps": 4},
        {"training.micro_batch_size": 1, "training.gradient_accumulation_steps": 8},
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
        data={"packing": False, "seq_len": 64}, speed={"loss_kernel": "hf"},
        recovery={"ladder_keeps": []}))  # the user lets the ladder change what the config sets
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


@pytest.mark.slow
def test_injected_oom_climbs_to_the_fused_step_rung_and_the_run_finishes(tmp_path):
    """Issue 39: the ladder's fused-step rung resumes a run. The micro-batch is the user's (kept: the micro-batch rung
    is held back), the whole effective batch in one micro-batch already, so the fused step needs no other change
    than itself and no clipping; an OOM injected while the step runs after backward climbs to it, the run resumes from
    its checkpoint with the step in backward and finishes."""
    cfg = write_config(tmp_path / "c.yaml", tiny_config(
        training={"max_steps": 4, "micro_batch_size": 8, "gradient_accumulation_steps": 1, "effective_batch_size": 8},
        data={"packing": False, "seq_len": 64}, speed={"loss_kernel": "chunked", "gradient_checkpointing": True},
        recovery={"ladder_keeps": ["training.micro_batch_size", "training.gradient_accumulation_steps"]}))
    run = tmp_path / "ladder"
    proc = cli("run", cfg, "--run-dir", run, "--quiet", env={"TRAINPILOT_INJECT_OOM": "3:8:fused"})
    assert proc.returncode == 0, proc.stderr
    changes = [r["changes"] for r in events(run, "retry")]
    assert changes == [{"training.optimizer_in_backward": True, "training.micro_batch_size": 8,
                        "training.gradient_accumulation_steps": 1, "training.max_grad_norm": 0.0}]
    assert max(e["step"] for e in events(run, "step")) == 4
    assert [e["step"] for e in events(run, "step")][-2:] == [3, 4]  # resumed from step 2's checkpoint
    text = (run / "config.yaml").read_text()  # the run folder's config says what it ran
    assert "optimizer_in_backward: true" in text and "max_grad_norm: 0.0" in text, text


def test_the_fused_step_rung_keeps_your_clipping_and_only_comes_where_it_saves_memory():
    keep = _walk(_resolved(recovery={"ladder_keeps": ["training.max_grad_norm"]}))
    assert not [s for s in keep if "training.optimizer_in_backward" in s]
    lora = _walk(_resolved(method={"type": "lora"}))
    assert not [s for s in lora if "training.optimizer_in_backward" in s]  # adapters: no gradient buffer to drop
    assert ladder._fused_step_rung(_resolved(speed={"precision": "fp16"}, model={"dtype": "float16"})) is None


# -- the user's settings are theirs ---------------------------------------------------------------------------
def _walk_all(cfg, phase=None) -> list[dict]:
    steps = []
    while (step := ladder.next_step(cfg, phase)) is not None:
        steps.append(step.changes)
        cfg = step.config
    return steps


def test_the_tiled_rung_comes_where_the_planner_can_plan_the_model_tiled():
    """Issue 32: at long sequences one checkpointed layer's recompute is what runs out; the ladder tiles the MLP after
    checkpointing (exact) — on CUDA, for supervised training of a model the planner plans tiled, DeepSpeed off."""
    def rung(cfg):
        return [s for s in _walk(cfg) if "speed.tiled_mlp" in s]

    assert rung(_resolved()) == [{"speed.tiled_mlp": True}]
    assert rung(_resolved(model={"architecture": "gpt-oss-20b"})) == []  # its MLP returns router scores: not tiled
    assert rung(_resolved(device="cpu", speed={"precision": "fp32"}, model={"dtype": "float32"})) == []
    assert rung(_resolved(training={"objective": "dpo"})) == []
    assert rung(_resolved(speed={"tiled_mlp": True})) == []


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_the_ladder_climbs_from_a_real_plan_to_its_end_without_a_refused_config(method):
    """Issue 29 item 8 (the ladder never crashes): from the planner's own resolved config on the 16 GB laptop, every
    rung is a config the config's rules accept — QLoRA's ladder stopped with a ConfigError at ZeRO-3 (4-bit weights
    cannot be sharded), which the supervisor met as a crash."""
    from trainer.hardware.source import open_probe
    from trainer.planning.plan import plan_run

    probe = open_probe(str(LAPTOP))
    try:
        hardware = probe.snapshot()
    finally:
        probe.close()
    cfg = C.validate({"model": {"architecture": "llama-3.1-8b"}, "method": {"type": method},
                      "training": {"micro_batch_size": 1}, "data": {"seq_len": 4096, "packing": False}})
    walked = _walk(C.replace(plan_run(cfg, hardware).resolved, **{"training.effective_batch_size": 8,
                                                                  "training.gradient_accumulation_steps": 8}))
    assert walked, "the ladder has rungs above this plan"
    assert all("deepspeed.offload_params" not in s for s in walked) or method != "qlora", walked


def test_every_rung_changes_only_the_ladders_settings():
    """LADDER_KEYS is the list recovery.ladder_keeps can hold: a rung changing anything else could not be kept."""
    configs = [_resolved(), _resolved(device="cpu", speed={"precision": "fp32"}, model={"dtype": "float32"}),
               _resolved(training={"objective": "kto"}), _resolved(deepspeed={"enabled": True, "zero_stage": 1})]
    grpo = _resolved(training={"objective": "grpo"}, rewards={"exact_answer": 1.0},
                     grpo={"num_generations": 2, "generation_batch_size": 8, "max_completion_length": 64})
    changed = {k for c in configs for s in _walk_all(c) for k in s}
    changed |= {k for phase in ("sampling", "update") for s in _walk_all(grpo, phase) for k in s}
    assert changed <= set(ladder.LADDER_KEYS), changed - set(ladder.LADDER_KEYS)
    assert "grpo.generation_batch_size" in changed and "deepspeed.offload_params" in changed


@pytest.mark.parametrize("kept", [["speed.loss_kernel", "deepspeed.enabled"], ["training.micro_batch_size"],
                                  ["speed.gradient_checkpointing", "speed.activation_offload"], ["speed.tiled_mlp"],
                                  ["deepspeed.zero_stage"], ["training.optimizer"]])
def test_no_rung_changes_a_kept_setting_and_the_report_names_it(kept):
    if not capabilities.installed("deepspeed"):
        pytest.skip("the offload rungs need DeepSpeed installed")
    if kept == ["training.optimizer"] and not capabilities.installed("bitsandbytes"):
        pytest.skip("the 8-bit AdamW rung needs bitsandbytes installed")
    cfg = _resolved(recovery={"ladder_keeps": kept})
    steps = _walk_all(cfg)
    last = cfg
    for s in steps:
        last = C.replace(last, **s)
    before, after = C.to_dict(cfg), C.to_dict(last)
    assert all(get_in(after, k) == get_in(before, k) for k in kept), steps
    assert steps, "the rungs that change none of them are still climbed"
    report = ladder.exhausted_report(last, [{"why": "x"}] * len(steps))
    held = {k for h in report["held_back"] for k in h["yours"]}
    if kept in (["training.optimizer"], ["speed.tiled_mlp"]):  # 8-bit AdamW (the tiled MLP) was passed over, then
        assert not held  # DeepSpeed came (its own optimizer; no tiled rung under it): at the end no rung needs the setting
        return
    assert held and held <= set(kept), report
    assert "settings your config sets" in report["message"]
    assert any(k in line for k in held for line in report["suggestions"][:len(report["held_back"])])


def test_auto_keeps_the_settings_your_config_gives_a_value():
    mine = C.validate({"training": {"micro_batch_size": 4, "gradient_accumulation_steps": "auto"},
                       "speed": {"loss_kernel": "hf", "gradient_checkpointing": "auto"},
                       "deepspeed": {"enabled": False}, "model": {"source": "demo-tiny-llama"}})
    assert ladder.kept_settings(mine) == {"training.micro_batch_size", "speed.loss_kernel", "deepspeed.enabled"}
    from trainer.hardware.source import open_probe
    from trainer.planning.plan import plan_run

    probe = open_probe(str(LAPTOP))
    try:
        plan = plan_run(mine, probe.snapshot())
    finally:
        probe.close()
    assert plan.resolved.recovery.ladder_keeps == ["deepspeed.enabled", "speed.loss_kernel",
                                                   "training.micro_batch_size"]
    assert plan.resolved.deepspeed.enabled is False and plan.resolved.speed.loss_kernel == "hf"
    assert ladder.kept_settings(C.validate({})) == frozenset()  # defaults are no one's choice


def test_a_kept_speed_chunked_loss_reads_as_its_new_spelling():
    """Run folders and GUI files written before speed.loss_kernel list speed.chunked_loss in ladder_keeps."""
    old = C.validate({"speed": {"chunked_loss": False}, "recovery": {"ladder_keeps": ["speed.chunked_loss"]}})
    assert old.speed.loss_kernel == "hf" and old.recovery.ladder_keeps == ["speed.loss_kernel"]
    assert ladder.kept_settings(old) == {"speed.loss_kernel"}


def test_a_misspelt_kept_setting_is_refused_naming_the_field():
    with pytest.raises(C.ConfigError) as err:
        C.validate({"recovery": {"ladder_keeps": ["deepspeed.enable"]}})
    assert "recovery.ladder_keeps" in str(err.value) and "'deepspeed.enable' is not a setting" in str(err.value)


def test_a_run_folder_older_than_ladder_keeps_keeps_nothing(tmp_path):
    from trainer.supervisor.supervise import _run_config

    (tmp_path / "config.yaml").write_text(C.dump_yaml(C.replace(_resolved(), **{"recovery.ladder_keeps": "auto"})))
    assert _run_config(tmp_path).recovery.ladder_keeps == []


@pytest.mark.slow
def test_explicit_hf_loss_and_no_deepspeed_are_never_turned_on(tmp_path):
    """Issue 29: an injected OOM turned both on. Every rung left would change a setting of the config's, so the run
    ends with exit 3, no traceback, nothing changed, and the message names them as what the user could change."""
    cfg = write_config(tmp_path / "c.yaml", tiny_config(training={"max_steps": 3}, speed={"loss_kernel": "hf",
                                                                                        "gradient_checkpointing": False}))
    run = tmp_path / "run"
    proc = cli("run", cfg, "--run-dir", run, "--quiet", env={"TRAINPILOT_INJECT_OOM": "1:0:chunked"})
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr and not events(run, "retry")
    for key in ("speed.loss_kernel", "deepspeed.enabled", "training.micro_batch_size"):
        assert key in proc.stderr, key
    resolved = C.load(run / "config.yaml")
    assert resolved.speed.loss_kernel == "hf" and resolved.deepspeed.enabled is False
    failed = events(run, "failed")[-1]
    assert failed["exit_code"] == 3 and failed["report"]["held_back"][0]["changes"] == {"speed.loss_kernel": "chunked"}


def test_what_a_resume_on_another_engine_carries_is_said_in_words():
    from trainer.rundir.checkpoints import engine_change, engine_meta

    cfg = _resolved()
    z2 = C.replace(cfg, **{"deepspeed.enabled": True, "deepspeed.zero_stage": 2, "deepspeed.offload_optimizer": True})
    assert engine_change(engine_meta(cfg), cfg) is None  # the library's own resume
    assert engine_change({"deepspeed": False, "zero_stage": None}, cfg) is None  # a marker older than the fields
    moved = engine_change(engine_meta(cfg), z2)
    assert moved["from"] == "plain PyTorch (AdamW)" and moved["to"].startswith("DeepSpeed ZeRO-2 with optimizer")
    assert "AdamW moments and step count (per parameter)" in moved["carried"] and not moved["not_carried"]
    eight = engine_change(engine_meta(cfg), C.replace(cfg, **{"training.optimizer": "adamw_8bit"}))
    assert eight["not_carried"][0].startswith("optimizer moments") and "weights" in eight["carried"]
    fp16 = C.replace(z2, **{"speed.precision": "fp16", "model.dtype": "float32"})
    assert any("loss scale" in line for line in engine_change(engine_meta(cfg), fp16)["not_carried"])


def test_an_exported_config_says_which_settings_were_yours(tmp_path):
    """``trainpilot-cli export`` writes every key; recovery.ladder_keeps keeps which ones the user chose."""
    from trainer.launch.export_scripts import export

    src = tmp_path / "mine.yaml"
    write_config(src, {"deepspeed": {"enabled": False}, "training": {"micro_batch_size": 4, "effective_batch_size": 8}})
    export(str(src), str(tmp_path / "out"))
    written = C.load(tmp_path / "out" / "config.yaml")
    assert written.recovery.ladder_keeps == ["deepspeed.enabled", "training.micro_batch_size"]
