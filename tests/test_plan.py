"""The planner on the shipped hardware fixtures (recorded or spec-written; see their first line)."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainer import config as C
from trainer.config.presets import load_preset
from trainer.core.errors import UserError
from trainer.hardware.source import open_probe
from trainer.models.spec import load_model_spec
from trainer.planning.budget import classify
from trainer.planning.memory import TrainSetup, estimate
from trainer.planning.plan import plan_run

FIX = Path(__file__).parent / "fixtures" / "hardware"
KEYS = {"preset", "tier", "form_factor", "verdict", "budget_bytes", "predicted_peak_bytes", "breakdown",
        "host_ram_needed_bytes", "settings", "reasons", "close_apps", "alternatives", "notes"}


def hw(name):
    return open_probe(str(FIX / f"{name}.jsonl")).snapshot()


def cfg(model="llama-3.2-1b", **sections):
    data = {"model": {"architecture": model}, "data": {"seq_len": 2048}}
    for k, v in sections.items():
        data.setdefault(k, {}).update(v)
    return C.validate(data)


def exact_batch(c):
    t = c.training
    return t.micro_batch_size * t.gradient_accumulation_steps * c.world_size == t.effective_batch_size


@pytest.mark.parametrize("fixture,preset,form,tier", [
    ("rtx4090_laptop_16gb", "laptop_16gb", "laptop", 16), ("desktop_24gb", "desktop_24gb", "desktop", 24),
    ("rtx5090_32gb", "desktop_32gb", "desktop", 32), ("no_gpu", "cpu", "cpu", None)])
def test_fixture_picks_preset(fixture, preset, form, tier):
    plan = plan_run(cfg("demo-tiny-llama"), hw(fixture))
    assert (plan.preset, plan.form_factor, plan.tier) == (preset, form, tier)
    d = json.loads(json.dumps(plan.to_dict()))
    assert KEYS <= set(d) and d["verdict"] == "fits"
    r = plan.resolved
    assert exact_batch(r) and r.device in ("cpu", "cuda") and isinstance(r.speed.gradient_checkpointing, bool)
    assert isinstance(r.deepspeed.enabled, bool)
    assert sum(d["breakdown"].values()) == d["predicted_peak_bytes"] or plan.device == "cpu"


def test_no_gpu_gives_cpu_plan_with_clear_note():
    plan = plan_run(cfg("demo-tiny-llama"), hw("no_gpu"))
    r = plan.resolved
    assert r.device == "cpu" and r.speed.precision == "fp32" and r.deepspeed.enabled is False
    assert r.speed.gradient_checkpointing is False
    assert any("no NVIDIA GPU" in n and "CPU" in n for n in plan.notes)


def test_cuda_only_requests_without_gpu_do_not_fit():
    hw_none = hw("no_gpu")
    cuda = plan_run(C.validate({"device": "cuda", "model": {"architecture": "demo-tiny-llama"}}), hw_none)
    assert cuda.verdict == "does_not_fit" and cuda.resolved.device == "cuda"  # explicit: kept, judged
    qlora = plan_run(C.validate({"method": {"type": "qlora"}, "model": {"architecture": "demo-tiny-llama"}}), hw_none)
    assert qlora.verdict == "does_not_fit" and any("bitsandbytes" in r for r in qlora.reasons)


def test_browser_is_listed_to_close_with_its_memory():
    plan = plan_run(cfg("llama-3.2-1b", speed={"loss_kernel": "hf"}), hw("rtx4090_laptop_16gb"))  # does not fit
    fox = [a for a in plan.close_apps if a["name"] == "firefox"]
    assert fox and fox[0]["used_memory_bytes"] > 1.5 * 2**30 and fox[0]["pid"] == 4411
    assert all(a["name"] != "Xorg" for a in plan.close_apps)  # the desktop itself is not "an app to close"
    assert any("firefox" in r for r in plan.reasons)


def test_largest_micro_batch_that_fits_and_exact_accumulation():
    plan = plan_run(cfg("llama-3.2-1b", training={"effective_batch_size": 32}, data={"seq_len": 512}),
                    hw("rtx5090_32gb"))
    r = plan.resolved
    assert plan.verdict == "fits" and exact_batch(r)
    mb = r.training.micro_batch_size
    spec = load_model_spec("llama-3.2-1b")
    bigger = [m for m in (2, 4, 8, 16, 32) if m > mb]
    ckpt = r.speed.gradient_checkpointing
    assert plan.predicted_peak_bytes <= plan.budget_bytes
    if bigger:
        nxt = estimate(spec, TrainSetup(micro_batch=min(bigger), seq_len=512, checkpointing=ckpt))
        assert nxt.peak_bytes > plan.budget_bytes


def test_explicit_values_are_kept_and_judged():
    c = cfg("llama-3.2-1b", training={"micro_batch_size": 16, "gradient_accumulation_steps": 1},
            speed={"gradient_checkpointing": False})
    plan = plan_run(c, hw("rtx4090_laptop_16gb"))
    assert plan.verdict == "does_not_fit"
    assert plan.resolved.training.micro_batch_size == 16 and plan.resolved.speed.gradient_checkpointing is False
    assert "training.micro_batch_size" not in plan.settings
    assert any("kept" in r for r in plan.reasons)
    assert plan.alternatives and plan.alternatives[0]["fits"]


def test_8b_full_finetune_on_16gb_laptop_does_not_fit_with_zero2(cuda_torch):
    c = cfg("llama-3.1-8b", deepspeed={"enabled": True, "zero_stage": 2, "offload_optimizer": True})
    snap = hw("rtx4090_laptop_16gb")
    plan = plan_run(c, snap)
    assert plan.verdict == "does_not_fit"
    assert plan.resolved.deepspeed.zero_stage == 2  # explicit: judged, not changed
    qlora, = [a for a in plan.alternatives if a["settings"].get("method.type") == "qlora"]
    assert qlora["predicted_peak_bytes"] <= plan.budget_bytes  # its memory fits; it fits here if nothing is missing
    assert qlora["fits"] == (qlora["needs"] == []) and set(qlora["needs"]) <= {"bitsandbytes"}
    z3 = [a for a in plan.alternatives if a["settings"].get("deepspeed.offload_params")]
    assert z3 and z3[0]["host_ram_needed_bytes"] > snap.host.ram_available_bytes
    assert "host RAM" in z3[0]["description"]
    assert plan.host_ram_needed_bytes > 100 * 2**30  # ZeRO-2 offload of 8B: DeepSpeed's own host estimate


def test_deepspeed_auto_offloads_only_when_needed():
    snap = hw("desktop_24gb")
    big_host = dataclasses.replace(snap, host=dataclasses.replace(snap.host, ram_available_bytes=240 * 2**30))
    small = plan_run(cfg("llama-3.2-1b", deepspeed={"enabled": "auto"}), big_host)
    assert small.resolved.deepspeed.enabled is False and small.verdict == "fits"
    large = plan_run(cfg("llama-3.2-3b", deepspeed={"enabled": "auto"}), big_host)
    assert large.verdict == "fits"
    assert large.resolved.deepspeed.enabled is True and large.resolved.deepspeed.offload_optimizer is True
    assert any("host RAM" in r for r in large.reasons)
    separate = cfg("llama-3.2-3b", deepspeed={"enabled": "auto"}, training={"optimizer_in_backward": False})
    tight_host = plan_run(separate, snap)  # 57 GB RAM is not enough for DeepSpeed's offload
    assert tight_host.verdict == "does_not_fit"
    # issue 39: with the optimizer step fused into backward (no gradient buffer) it fits without DeepSpeed
    fused = plan_run(cfg("llama-3.2-3b", deepspeed={"enabled": "auto"}), snap)
    assert fused.verdict == "fits" and fused.resolved.deepspeed.enabled is False
    assert fused.resolved.training.optimizer_in_backward is True and fused.resolved.training.max_grad_norm == 0


def test_most_headroom_keeps_more_free():
    c = cfg("llama-3.2-1b", data={"seq_len": 512}, training={"effective_batch_size": 64})
    fast = plan_run(c, hw("rtx5090_32gb"), goal="fastest")
    roomy = plan_run(c, hw("rtx5090_32gb"), goal="most_headroom")
    assert roomy.budget_bytes < fast.budget_bytes
    assert roomy.predicted_peak_bytes <= fast.predicted_peak_bytes


def test_unknown_model_gives_unknown_verdict_not_crash():
    c = C.validate({"model": {"source": "nobody/unheard-of-model"}})
    plan = plan_run(c, hw("desktop_24gb"))
    assert plan.verdict == "unknown" and plan.predicted_peak_bytes is None
    assert exact_batch(plan.resolved) and plan.resolved.speed.gradient_checkpointing is True
    assert any("is not downloaded (its config.json is not on this computer)" in n for n in plan.notes)


def test_classify_tiers():
    g = hw("desktop_24gb").gpus[0]
    assert classify(dataclasses.replace(g, memory_total_bytes=12 * 2**30))[2] == "laptop_16gb"
    assert classify(dataclasses.replace(g, memory_total_bytes=48 * 2**30))[1:] == ("datacenter", "datacenter_80gb")
    assert classify(dataclasses.replace(g, name="NVIDIA H100 80GB HBM3", memory_total_bytes=80 * 2**30))[0] == 80


def test_presets():
    with pytest.raises(UserError, match="unknown preset"):
        load_preset("no_such_preset")


def test_plan_never_imports_torch():
    """What a plan costs is measured by benchmarks/plan_cost.py (a figure of the machine, not a test)."""
    code = ("import sys; from trainer import config as C; from trainer.hardware.source import open_probe; "
            "from trainer.planning.plan import plan_run; "
            f"hw = open_probe({str(FIX / 'rtx4090_laptop_16gb.jsonl')!r}).snapshot(); "
            "c = C.validate({'model': {'architecture': 'llama-3.1-8b'}}); p = plan_run(c, hw); "
            "assert 'torch' not in sys.modules, 'torch imported'; print(p.verdict)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).parents[1])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() != "unknown", "the shipped 8B architecture is planned"


@pytest.mark.slow  # measured >= 3.5 s on the 2-core machine
def test_an_alternative_that_fits_can_run_here(monkeypatch):
    """Issue 29 item 7: QLoRA's alternatives on the CPU (or without bitsandbytes) said 'fits' — a smaller model
    trained with QLoRA that this machine cannot run at all. Every alternative says what it needs; one that needs
    something is not 'fits'; a QLoRA plan is offered 16-bit LoRA."""
    import sys

    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    for machine in ("no_gpu", "rtx4090_laptop_16gb"):
        for method in ("full", "lora", "qlora"):
            c = C.validate({"model": {"source": "llama-3.1-8b", "architecture": "llama-3.1-8b", "tokenizer": "demo"},
                            "method": {"type": method}, "data": {"seq_len": 65536}})  # past QLoRA's longest (39,936)
            plan = plan_run(c, hw(machine))
            assert plan.alternatives or method != "qlora", (machine, method)
            for alt in plan.alternatives:
                assert not (alt["fits"] and alt["needs"]), alt
                if alt["settings"].get("method.type") == "qlora" or (method == "qlora" and "method.type" not in alt["settings"]):
                    assert not alt["fits"] and alt["needs"], alt  # no bitsandbytes here, or no GPU
            if method == "qlora":
                assert any(a["settings"].get("method.type") == "lora" for a in plan.alternatives)


def test_the_lengths_grid_is_one_rule():
    """Issue 40: multiples of the step by bisection, halvings of it below (down to 256 tokens), never over the top."""
    from trainer.planning.lengths import longest_fitting

    upto = lambda n: (lambda t: t if t <= n else None)  # noqa: E731  (fits up to n tokens)
    assert longest_fitting(upto(5000), 131_072) == (4096, 4096)
    assert longest_fitting(upto(700), 131_072) == (512, 512) and longest_fitting(upto(10**6), 300) == (256, 256)
    assert longest_fitting(upto(200), 131_072) == (0, None)
    assert longest_fitting(upto(10**6), 9000, step=4096) == (8192, 8192)


def test_a_shorter_sequence_is_the_longest_that_fits():
    """Issue 40: "a shorter sequence that fits" was a power of two in the alternatives (32,768) and a multiple of
    1,024 in ``plan --max-seq`` (39,936) for one run: one grid, one answer."""
    from trainer.planning.longest import longest

    c = C.validate({"model": {"source": "llama-3.2-1b", "architecture": "llama-3.2-1b", "tokenizer": "demo"},
                    "method": {"type": "lora"}, "data": {"seq_len": 131_072}})
    plan = plan_run(c, hw("rtx4090_laptop_16gb"))
    shorter = [a for a in plan.alternatives if "data.seq_len" in a["settings"]]
    assert [a["settings"]["data.seq_len"] for a in shorter] == [longest(c, hw("rtx4090_laptop_16gb")).tokens] == [39_936]
    assert shorter[0]["fits"] and shorter[0]["description"] == "shorter sequences: data.seq_len 39936"


def test_shorter_sequences_are_lengths_the_model_reads():
    """Issue 29 item 7: a typed seq_len of 99999999 on the 512-position demo model had Review suggest seq 499999."""
    plan = plan_run(C.validate({"data": {"seq_len": 99_999_999}}), hw("no_gpu"))
    shorter = [a for a in plan.alternatives if "data.seq_len" in a["settings"]]
    assert all(a["settings"]["data.seq_len"] in (512, 256) for a in shorter)
