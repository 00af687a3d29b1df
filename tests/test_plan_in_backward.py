"""Issue 39, the planner's side: the optimizer step fused into backward and where AdamW's states live, on the
hardware recordings (tests/fixtures/hardware), through ``plan_run`` and ``trainpilot-cli plan``.

The memory terms are the worker's as built (trainer/worker/loading/in_backward_step.py; planning/optimizer_memory.py): the
verdicts below follow from them, they are not tuned to reach "fits"."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from helpers_train import cli, write_config
from trainer import config as C
from trainer.config.resolved import as_resolved
from trainer.core import capabilities
from trainer.core.units import GIB
from trainer.hardware.source import open_probe
from trainer.models.spec import load_model_spec
from trainer.planning import optimizer_memory, saver_memory
from trainer.planning.memory import TrainSetup, estimate
from trainer.planning.plan import plan_run

FIX = Path(__file__).parent / "fixtures" / "hardware"
LAPTOP, DESKTOP = "rtx4090_laptop_16gb", "desktop_24gb"
bnb = pytest.mark.skipif(not capabilities.installed("bitsandbytes"), reason="paged and 8-bit states are bitsandbytes'")


def hw(name):
    probe = open_probe(str(FIX / f"{name}.jsonl"))
    try:
        return probe.snapshot()
    finally:
        probe.close()


def cfg(model, **sections):
    data = {"model": {"architecture": model}, "data": {"seq_len": 2048}, "training": {"effective_batch_size": 8}}
    for k, v in sections.items():
        data[k] = {**data.get(k, {}), **v} if isinstance(v, dict) else v
    return C.validate(data)


def says(plan, *words) -> bool:
    """Some reason holds every one of ``words``."""
    return any(all(w in r for w in words) for r in plan.reasons)


def assert_names_the_fused_step(plan):
    """What issue 39 asks every such plan to say: the fused step, where the states live, exact or approximate, and
    that clipping is off."""
    assert says(plan, "optimizer step fused into backward", "gradient buffer becomes"), plan.reasons
    assert says(plan, "optimizer states:"), plan.reasons
    assert says(plan, "exact") or says(plan, "approximate: 8-bit optimizer states"), plan.reasons
    assert says(plan, "gradient clipping off (training.max_grad_norm: 0)"), plan.reasons


def assert_runs_as_planned(plan, micro):
    """The resolved config is one the worker accepts (its cross-checks ran in validate) and carries the fused step."""
    r = plan.resolved
    assert r.training.optimizer_in_backward is True and r.training.max_grad_norm == 0
    assert (r.training.micro_batch_size, r.training.gradient_accumulation_steps) == (micro, 1)
    assert r.training.effective_batch_size == 8  # never changed
    assert as_resolved(r) is not None


@bnb
def test_qwen_1_5b_full_fits_the_laptop_with_the_fused_step_and_its_states_on_the_gpu():
    """Qwen2.5-1.5B, seq 2048, effective batch 8: did not fit the 16 GB laptop with the separate step (14.4 GiB of
    12.8 before issue 39); the fused step drops the 2.9 GiB gradient buffer and fits the whole batch in one
    micro-batch, PyTorch AdamW's states on the GPU (the first placement, no paging)."""
    plan = plan_run(cfg("qwen2.5-1.5b"), hw(LAPTOP))
    assert plan.verdict == "fits", plan.reasons
    assert_runs_as_planned(plan, 8)
    assert_names_the_fused_step(plan)
    assert says(plan, "optimizer states: PyTorch AdamW's states", "on the GPU")
    # no gradient buffer: at most one weight's gradient at the peak's moment (the tied LM head's, buffered by the
    # engine through the layers' backward: in_backward_memory.fused_step_moments)
    n = optimizer_memory.largest_param(load_model_spec("qwen2.5-1.5b"))
    assert plan.breakdown.get("gradients", 0) <= 2 * n and plan.breakdown["in_backward_workspace"] > 0


@bnb
def test_qwen_1_5b_full_fits_the_laptop_with_fp32_states_paged_to_host_ram():
    """Done means: Qwen2.5-1.5B full on the laptop with fp32 states, exact, paged to host RAM."""
    c = cfg("qwen2.5-1.5b", training={"optimizer": "paged_adamw_32bit", "optimizer_in_backward": True,
                                      "max_grad_norm": 0})
    plan = plan_run(c, hw(LAPTOP))
    assert plan.verdict == "fits", plan.reasons
    assert_runs_as_planned(plan, 8)
    assert_names_the_fused_step(plan)
    assert says(plan, "fp32 AdamW states (bitsandbytes' PagedAdamW32bit) paged to host RAM", "cross PCIe")
    assert says(plan, "exact: bitsandbytes' fp32 AdamW")
    spec = load_model_spec("qwen2.5-1.5b")
    assert plan.host_breakdown["paged_optimizer_states"] == 8 * spec.trainable_params
    # the working set: the largest parameter's fp32 states (the embedding, 151,936 × 1,536)
    assert plan.breakdown["paged_states_working_set"] == 8 * 151936 * 1536
    assert plan.resolved.training.optimizer == "paged_adamw_32bit"


@bnb
@pytest.mark.parametrize("model,machine", [("llama-3.1-8b", DESKTOP), ("llama-3.2-3b", LAPTOP)])
def test_the_largest_targets_fit_with_the_fused_step_and_8bit_paged_states(model, machine):
    """Issue 39's targets (plan_allow_approximate): Llama-3.1-8B full on the 24 GB desktop and Llama-3.2-3B full on the
    16 GB laptop, seq 2048, effective batch 8 kept exact in one micro-batch: the fused step with 8-bit states paged to
    host RAM. Their working set on the GPU is the largest parameter's 8-bit states (the fused step keeps no 32-bit
    embedding override), and the hook's fp32 norm copy is one chunk of the largest gradient."""
    plan = plan_run(cfg(model, plan_allow_approximate=True), hw(machine))
    assert plan.verdict == "fits", (plan.predicted_peak_bytes, plan.budget_bytes, plan.reasons)
    assert_runs_as_planned(plan, 8)
    assert_names_the_fused_step(plan)
    assert plan.resolved.training.optimizer == "paged_adamw_8bit"
    assert says(plan, "8-bit AdamW states (bitsandbytes' PagedAdamW8bit) paged to host RAM")
    assert says(plan, "approximate: 8-bit optimizer states", "embeddings' too", "plan_allow_approximate allows it")
    spec = load_model_spec(model)
    n = optimizer_memory.largest_param(spec)
    assert plan.breakdown["paged_states_working_set"] == saver_memory.adam8_bytes(n)
    assert plan.breakdown["in_backward_workspace"] == 4 * min(n, optimizer_memory.NORM_CHUNK)


@bnb
def test_qwen3_4b_on_the_laptop_is_tight_with_the_fused_step_and_says_what_is_over():
    """Qwen3-4B full on the 16 GB laptop comes within the margin, not under the budget: 'tight', the fused step with
    8-bit paged states named, and the alternatives offered."""
    plan = plan_run(cfg("qwen3-4b", plan_allow_approximate=True), hw(LAPTOP))
    assert plan.verdict == "tight" and plan.predicted_peak_bytes > plan.budget_bytes
    assert_names_the_fused_step(plan)
    assert plan.resolved.training.optimizer == "paged_adamw_8bit"


def test_plans_that_fit_with_the_separate_step_stay_as_they_were():
    plan = plan_run(cfg("llama-3.2-1b"), hw(LAPTOP))
    assert plan.verdict == "fits" and "training.optimizer_in_backward" not in plan.settings
    assert plan.resolved.training.optimizer_in_backward is None and plan.resolved.training.max_grad_norm == 1.0
    lora = plan_run(cfg("llama-3.1-8b", method={"type": "lora"}), hw(DESKTOP))
    assert "training.optimizer_in_backward" not in lora.settings


def test_your_clipping_and_your_optimizer_in_backward_false_are_kept():
    """An explicit max_grad_norm (clipping needs every gradient) or optimizer_in_backward: false rules it out."""
    for extra in ({"max_grad_norm": 1.0}, {"optimizer_in_backward": False}):
        plan = plan_run(cfg("qwen2.5-1.5b", training=extra), hw(LAPTOP))
        assert plan.verdict != "fits" and "training.optimizer_in_backward" not in plan.settings
        assert plan.resolved.training.max_grad_norm == extra.get("max_grad_norm", 1.0)
        assert any(a["description"].startswith("full fine-tune with fp32 states paged") for a in plan.alternatives) \
            == ("max_grad_norm" not in extra and "optimizer_in_backward" not in extra)


@bnb
def test_paged_states_stay_on_the_gpu_on_windows():
    """CUDA managed memory cannot oversubscribe the GPU on Windows: the paged states are planned in VRAM there."""
    machine = hw(LAPTOP)
    windows = dataclasses.replace(machine, host=dataclasses.replace(machine.host, platform="Windows"))
    c = cfg("qwen2.5-1.5b", training={"optimizer": "paged_adamw_32bit", "optimizer_in_backward": True,
                                      "max_grad_norm": 0})
    plan = plan_run(c, windows)
    assert "paged_optimizer_states" not in plan.host_breakdown and "paged_states_working_set" not in plan.breakdown
    assert plan.breakdown["optimizer_states"] == 8 * load_model_spec("qwen2.5-1.5b").trainable_params
    assert says(plan, "planned on the GPU", "on Windows managed memory cannot oversubscribe")


def test_the_fused_steps_memory_terms():
    """No gradient buffer: the largest parameter's gradient (unless the chunked loss already holds the LM head's),
    with the fp32 copy of one chunk the hook takes its norm on; the fused step's 8-bit states are 8-bit for the
    embeddings too."""
    spec = load_model_spec("llama-3.1-8b")
    head = spec.vocab * spec.hidden
    base = TrainSetup(micro_batch=1, seq_len=2048, checkpointing=True)
    separate, fused = estimate(spec, base), estimate(spec, dataclasses.replace(base, in_backward=True))
    assert separate.breakdown["gradients"] == 2 * spec.trainable_params
    assert fused.breakdown["gradients"] == 2 * head
    assert fused.breakdown["in_backward_workspace"] == 4 * optimizer_memory.NORM_CHUNK < 4 * head  # one chunk
    chunked = estimate(spec, dataclasses.replace(base, in_backward=True, loss_kernel="chunked"))
    assert "gradients" not in chunked.breakdown  # the loss holds the head's gradient (counted in logits_loss)
    paged = estimate(spec, dataclasses.replace(base, in_backward=True, optimizer="paged_adamw_8bit"))
    assert paged.breakdown["paged_states_working_set"] == saver_memory.adam8_bytes(head)
    separate_8bit = estimate(spec, dataclasses.replace(base, optimizer="adamw_8bit")).breakdown["optimizer_states"]
    # the separate step keeps HF's 32-bit embedding states; the fused step's are 8-bit (in_backward_step._drop_overrides)
    assert paged.host_breakdown["paged_optimizer_states"] == separate_8bit - 8 * spec.embedding_params + \
        saver_memory.adam8_bytes(spec.embedding_params)
    assert fused.peak_bytes < separate.peak_bytes - 12 * GIB


@bnb
def test_trainpilot_cli_plan_says_fits_for_qwen_1_5b_on_the_laptop(tmp_path):
    path = write_config(tmp_path / "c.yaml", {"model": {"architecture": "qwen2.5-1.5b"}, "data": {"seq_len": 2048},
                                              "training": {"effective_batch_size": 8}})
    proc = cli("plan", path, "--hardware", FIX / f"{LAPTOP}.jsonl", "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["verdict"] == "fits" and d["settings"]["training.optimizer_in_backward"] is True
    assert d["settings"]["training.max_grad_norm"] == 0 and d["settings"]["training.gradient_accumulation_steps"] == 1
    assert any("optimizer step fused into backward" in r for r in d["reasons"])


@pytest.mark.slow
def test_a_run_that_asks_for_the_fused_step_gets_one_micro_batch_and_the_plan_says_so(tmp_path):
    """``trainpilot-cli run`` with ``optimizer_in_backward: true`` and the batch left to the planner: the run's
    config.yaml has the whole effective batch in one micro-batch, and its plan.json names the fused step."""
    from helpers_train import events, tiny_config

    path = write_config(tmp_path / "c.yaml", tiny_config(
        training={"max_steps": 2, "micro_batch_size": "auto", "gradient_accumulation_steps": "auto",
                  "effective_batch_size": 4, "optimizer_in_backward": True, "max_grad_norm": 0}))
    run = tmp_path / "run"
    proc = cli("run", path, "--run-dir", run, "--quiet")
    assert proc.returncode == 0, proc.stderr
    written = (run / "config.yaml").read_text()
    assert "micro_batch_size: 4" in written and "gradient_accumulation_steps: 1" in written, written
    plan = json.loads((run / "plan.json").read_text())
    assert any(r.startswith("optimizer step fused into backward") for r in plan["reasons"]), plan["reasons"]
    assert any("effective batch 4 kept exact in one micro-batch of 4" in r for r in plan["reasons"])
    assert max(e["step"] for e in events(run, "step")) == 2


@bnb
def test_the_8b_at_effective_batch_24_is_offered_what_fits_and_the_hint_survives_the_click(cuda_torch):
    """Walkthrough 1 (issue 45): Llama-3.1-8B full on the 24 GB desktop at an effective batch where nothing fits (24:
    since the fused step's peak is the largest of its moments, issue 46, the 8-bit paged plan fits up to 16, where it
    fitted up to 10). The Method page's one click used to apply 8-bit paged states at your batch ('does not fit')
    and the hint 'the largest effective batch that fits is N' was gone once training.optimizer was set.
    Now the click is the option at the largest effective batch that fits, its plan fits, and a config that asks
    for the fused step itself keeps the hint."""
    from trainer.planning import verdict

    mine = cfg("llama-3.1-8b", training={"effective_batch_size": 24})
    options = verdict.step_options(mine, hw(DESKTOP))
    by_key = {o.key: o for o in options}
    assert not any(o.verdict == "fits" for o in options)
    eight = by_key["paged_adamw_8bit"]
    assert eight.verdict != "fits" and eight.smaller_batch is not None and 1 <= eight.smaller_batch < 24
    assert eight.smaller_batch_peak_bytes <= eight.budget_bytes
    offer = verdict.one_click_offer(options)
    assert offer is not None and offer.smaller_batch is not None
    clicked = C.replace(mine, **offer.click_changes)
    assert clicked.training.effective_batch_size == offer.smaller_batch
    plan = plan_run(clicked, hw(DESKTOP), alternatives=False)
    assert plan.verdict == "fits", (plan.predicted_peak_bytes, plan.budget_bytes)
    assert plan.resolved.training.optimizer == offer.key and plan.resolved.training.optimizer_in_backward is True
    # the same placement asked for at 24 (what the old click wrote): the hint is still there, with the same batch
    asked = C.replace(mine, **eight.changes)
    plan = plan_run(asked, hw(DESKTOP), alternatives=False)
    assert plan.verdict != "fits"
    assert says(plan, "the largest effective batch that fits in one micro-batch is "
                      f"{eight.smaller_batch}", "set training.effective_batch_size"), plan.reasons


@bnb
def test_the_cli_alternatives_offer_the_fused_step_at_the_batch_that_fits_and_say_when_host_ram_is_short():
    """The CLI's alternatives for the same plan: the 8-bit paged one at the largest effective batch it keeps exact
    (fits, and says the batch is not yours), never at 24 where it does not fit; the fp32 paged one says host RAM is
    what it lacks; 'not even an effective batch of 1' names the placements it was tried with."""
    plan = plan_run(cfg("llama-3.1-8b", training={"effective_batch_size": 24}), hw(DESKTOP))
    assert plan.verdict != "fits"
    alts = {a["description"].split(" and the step")[0]: a for a in plan.alternatives}
    eight = alts["full fine-tune with 8-bit states paged to host RAM"]
    assert eight["fits"] and "(yours: 24; the largest that fits in one micro-batch)" in eight["description"]
    batch = eight["settings"]["training.effective_batch_size"]
    assert 1 <= batch < 24 and eight["settings"]["training.micro_batch_size"] == batch
    assert plan_run(C.replace(cfg("llama-3.1-8b", training={"effective_batch_size": 24}), **eight["settings"]),
                    hw(DESKTOP), alternatives=False).verdict == "fits"
    fp32 = alts["full fine-tune with fp32 states paged to host RAM"]
    assert not fp32["fits"] and "of host RAM (" in fp32["description"] and "usable" in fp32["description"]
    assert says(plan, "with the optimizer step fused into backward and states on the GPU or fp32 states paged to "
                      "host RAM, not even an effective batch of 1 fits (the nearest:"), plan.reasons
