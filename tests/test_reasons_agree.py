"""Walkthrough 3 of issue 45: reasons that contradicted their own numbers, each on the recording where it was seen
(tests/fixtures/hardware), through ``plan_run`` as the CLI and the Method page call it."""
from __future__ import annotations

from test_plan_in_backward import LAPTOP, bnb, cfg, hw, says

from trainer import config as C
from trainer.planning.longest import longest_context
from trainer.planning.plan import plan_run
from trainer.planning.speed import OFFLOAD_MIN_GAIN


@bnb
def test_a_tight_plan_never_calls_its_own_variant_does_not_fit():
    """Qwen3-4B full on the laptop (8-bit paged states allowed): the headline 'Fits (tight) 13.3 GiB' sat beside
    'with it [the tiled MLP] the run does not fit (needs 13.3 GiB)'. The same need reads 'tight' in both."""
    plan = plan_run(cfg("qwen3-4b", plan_allow_approximate=True), hw(LAPTOP))
    assert plan.verdict == "tight", plan.reasons
    tiled = next(r for r in plan.reasons if r.startswith("tiled MLP on"))
    assert "with it the run is tight (needs" in tiled and "within its margin" in tiled, tiled
    assert "with it the run does not fit" not in tiled


@bnb
def test_the_longest_context_says_a_longer_length_is_tight_rather_than_hiding_it():
    """The same plan's 'Longest context: 1,024 tokens' while its own 2,048 is tight (and Start allows it)."""
    found = longest_context(cfg("qwen3-4b", plan_allow_approximate=True), hw(LAPTOP))
    assert found.here.tokens < 2048 and found.here.tight == 2048
    assert "2,048 is tight (within the plan's margin" in found.words(), found.words()


@bnb
def test_the_tiled_mlp_is_weighed_against_the_saver_it_spares_by_time():
    """Qwen2.5-1.5B full on the laptop, effective batch 16: the tiled MLP went on although its own reason said the
    run fits without it at a lower peak (11.8 against 12.6 GiB, +17% compute) — kept because without it the states
    are paged to host RAM, a memory saver more. Both fit: the reason gives both times by the one time model, and
    the other saver is taken only where estimated 10% faster (OFFLOAD_MIN_GAIN, as checkpointing against offload)."""
    plan = plan_run(cfg("qwen2.5-1.5b", training={"effective_batch_size": 16}), hw(LAPTOP))
    assert plan.verdict == "fits"
    why = next(r for r in plan.reasons if r.startswith("tiled MLP o"))
    assert "s per optimizer step" in why and "fp32 AdamW states paged to host RAM" in why, why
    tiled_on = plan.resolved.speed.tiled_mlp
    off, on = (float(part.split("≈ ")[1].split(" s")[0]) for part in why.split("with it")[:2])
    assert tiled_on == (off >= (1 - OFFLOAD_MIN_GAIN) * on), (off, on, tiled_on)
    assert why.startswith("tiled MLP on" if tiled_on else "tiled MLP off")
    assert (plan.resolved.training.optimizer == "paged_adamw_32bit") == (not tiled_on)


def test_a_cpu_plan_with_the_fused_step_speaks_of_host_ram_not_the_gpu():
    """The demo on the CPU with the fused step said 'the 0.0 GiB gradient buffer becomes 0.0 GiB; peak 0.0 → 0.0'
    under a 0.6 GiB headline, and 'states on the GPU'."""
    plan = plan_run(C.replace(C.validate({"model": {"source": "demo-tiny-llama"}, "device": "cpu",
                                          "speed": {"precision": "fp32"}}),
                              **{"training.optimizer_in_backward": True, "training.max_grad_norm": 0}),
                    hw("no_gpu"))
    fused = next(r for r in plan.reasons if r.startswith("optimizer step fused into backward"))
    assert "0.0 GiB gradient buffer" not in fused and "under 0.05 GiB for this model" in fused, fused
    headline = f"{plan.predicted_peak_bytes / 2**30:.1f} GiB"
    assert fused.endswith(f"→ {headline}") and "host RAM" in fused, (fused, headline)
    assert not any("on the GPU" in r for r in plan.reasons), plan.reasons
    assert says(plan, "optimizer states:", "in host RAM (training on the CPU)")
