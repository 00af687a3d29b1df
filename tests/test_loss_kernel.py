"""Which loss a run computes has one home (trainer/planning/loss_kernel.py): the default is the fastest loss that
fits — Liger where it runs and is exact, else HF's loss wherever it fits, the chunked loss only where it lets the
run fit or run faster — torch.compile never meets Liger's kernels, explicit values win and are judged, and the
planner, the OOM ladder, preflight and the worker all ask the same rule. Plans through ``trainpilot-cli plan`` on
the hardware recordings."""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml

from trainer import config as C
from trainer.cli.main import main
from trainer.core.units import GIB
from trainer.hardware.source import open_probe
from trainer.models.spec import load_model_spec
from trainer.planning import flops, loss_kernel, requirements, search, speed, throughput
from trainer.planning.context import Context
from trainer.planning.memory import TrainSetup, estimate

ROOT = Path(__file__).parents[1]
FIX = ROOT / "tests" / "fixtures" / "hardware"


def _plan(tmp_path, capsys, hardware: str, arch: str, seq: int, *sets: str) -> dict:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"model": {"architecture": arch}, "data": {"seq_len": seq},
                                    "training": {"effective_batch_size": 16}}))
    args = ["plan", str(path), "--hardware", str(FIX / f"{hardware}.jsonl"), "--json"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


def _loss_reason(plan: dict) -> str:
    return next(r for r in plan["reasons"] if r.startswith("loss:"))


def _gib_figures(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"([\d.]+) GiB", text)]


def test_a_run_whose_hf_loss_fits_keeps_hf_loss(tmp_path, capsys):
    """Issue 33: on the H100, Llama-3.2-1B at sequence 2048 fits micro-batch 8 with HF's loss (68 GiB of 80 measured
    there): it keeps HF's loss, 40.9k tokens/s where the chunked loss ran at 28.6k."""
    plan = _plan(tmp_path, capsys, "h100_training", "llama-3.2-1b", 2048)
    assert plan["verdict"] == "fits" and plan["settings"]["speed.loss_kernel"] == "hf"
    assert plan["settings"]["training.micro_batch_size"] == 8
    spec = load_model_spec("llama-3.2-1b")
    assert plan["breakdown"]["logits_loss"] == 8 * 8 * 2048 * spec.vocab  # the full logits, planned as such
    why = _loss_reason(plan)
    assert why.startswith("loss: HF's loss, the fastest that fits") and "the chunked loss would fit" in why
    hf_need, budget, chunked_need = _gib_figures(why)  # both figures: HF's need, the budget, the chunked loss's need
    assert hf_need == round(plan["predicted_peak_bytes"] / GIB, 1) and budget == round(plan["budget_bytes"] / GIB, 1)
    assert "estimated" in why and f"below the {loss_kernel.FASTER_BY:.2f}×" in why  # the speed basis
    assert not [s for s in plan["savings"] if s["saver"].endswith("_loss")]  # no saver claimed that is not used


def test_the_cpu_demo_keeps_hf_loss(tmp_path, capsys):
    plan = _plan(tmp_path, capsys, "no_gpu", "demo-tiny-llama", 512)
    assert plan["settings"]["speed.loss_kernel"] == "hf" and plan["verdict"] == "fits"


def test_the_chunked_loss_is_chosen_where_hf_loss_does_not_fit(tmp_path, capsys):
    """The 16 GB laptop, Llama-3.2-1B full at sequence 4096: HF's logits (0.5M × 128k) do not fit with any saver."""
    plan = _plan(tmp_path, capsys, "rtx4090_laptop_16gb", "llama-3.2-1b", 4096)
    hf = _plan(tmp_path, capsys, "rtx4090_laptop_16gb", "llama-3.2-1b", 4096, "speed.loss_kernel=hf")
    assert plan["verdict"] == "fits" and plan["settings"]["speed.loss_kernel"] == "chunked"
    assert hf["verdict"] != "fits" and hf["predicted_peak_bytes"] > hf["budget_bytes"]
    why = _loss_reason(plan)
    assert "HF's loss does not fit" in why and "the chunked loss fits" in why
    hf_need, budget, chunked_need = _gib_figures(why)
    assert hf_need > budget >= chunked_need == round(plan["predicted_peak_bytes"] / GIB, 1)
    row = next(s for s in plan["savings"] if s["saver"] == "chunked_loss")
    assert row["without_bytes"] > plan["budget_bytes"] >= plan["predicted_peak_bytes"]


def test_the_chunked_loss_is_chosen_where_a_larger_micro_batch_is_estimated_faster(tmp_path, capsys):
    """Qwen2.5-0.5B on the laptop: HF's loss fits micro-batch 2, the chunked loss 4 — 2,048 tokens per micro-batch
    leave the GPU idle for a 0.5B model, so the chunked loss is estimated faster and says by how much and why."""
    plan = _plan(tmp_path, capsys, "rtx4090_laptop_16gb", "qwen2.5-0.5b", 1024)
    hf = _plan(tmp_path, capsys, "rtx4090_laptop_16gb", "qwen2.5-0.5b", 1024, "speed.loss_kernel=hf")
    assert plan["settings"]["speed.loss_kernel"] == "chunked" and hf["verdict"] == "fits"
    assert plan["settings"]["training.micro_batch_size"] > hf["settings"]["training.micro_batch_size"]
    why = _loss_reason(plan)
    ratio = float(re.search(r"estimated ([\d.]+)×", why).group(1))
    assert ratio >= loss_kernel.FASTER_BY and "tokens per micro-batch" in why
    spec = load_model_spec("qwen2.5-0.5b")
    peak = speed.peak_flops("NVIDIA GeForce RTX 4090 Laptop GPU")

    def step(micro, kernel):  # the plan's one time model: the optimizer step's micro-batches (nothing crosses PCIe)
        s = TrainSetup(micro_batch=micro, seq_len=1024, loss_kernel=kernel, method=C.validate({}).method.type)
        return 16 // micro * speed.compute_seconds(spec, s, peak)
    want = loss_kernel.CHUNKED_SPEED * step(hf["settings"]["training.micro_batch_size"], "hf") / \
        step(plan["settings"]["training.micro_batch_size"], "chunked")
    assert ratio == round(want, 2)


def _ctx(arch: str, hardware: str, liger: bool, **over) -> Context:
    data = {"model": {"architecture": arch}, "data": {"seq_len": 2048}, "training": {"effective_batch_size": 16}}
    for k, v in over.items():
        data.setdefault(k, {}).update(v)
    hw = open_probe(str(FIX / f"{hardware}.jsonl")).snapshot()
    return dataclasses.replace(Context.build(C.validate(data), hw, hw.gpus[0], "cuda", "fastest"), liger=liger)


def test_liger_where_it_runs_and_is_exact():
    """With liger-kernel and Triton on a GPU (``Context.liger``), Liger's fused loss is the default for the families
    it patches: the fastest measured, no full logits; planned with its own working memory."""
    choice = search.search(_ctx("llama-3.2-1b", "h100_training", liger=True))
    assert choice.loss_kernel == "liger" and choice.settings["speed.loss_kernel"] == "liger"
    assert any(r.startswith("loss: Liger's fused loss") and "54.5k" in r for r in choice.reasons)
    hf = search.search(_ctx("llama-3.2-1b", "h100_training", liger=True, speed={"loss_kernel": "hf"}))
    assert choice.estimate.breakdown["logits_loss"] < hf.estimate.breakdown["logits_loss"] / 10
    assert search.search(_ctx("stablelm-2-1.6b", "h100_training", liger=True)).loss_kernel != "liger"  # not patched
    assert search.search(_ctx("llama-3.2-1b", "h100_training", liger=False)).loss_kernel == "hf"


def test_torch_compile_never_meets_liger():
    """Measured on the H100: compile + Liger crashes at step 1 (illegal memory access in an inductor kernel);
    compile + HF's loss ran fastest. Under speed.torch_compile the default leaves Liger out and says so."""
    choice = search.search(_ctx("llama-3.2-1b", "h100_training", liger=True, speed={"torch_compile": True}))
    assert choice.loss_kernel == "hf"
    why = next(r for r in choice.reasons if r.startswith("loss:"))
    assert "Liger's fused loss is left out under speed.torch_compile" in why and "illegal memory access" in why
    for arch, seq in (("qwen2.5-0.5b", 1024), ("llama-3.2-1b", 4096)):  # where the chunked loss is picked instead
        ctx = _ctx(arch, "rtx4090_laptop_16gb", liger=True, speed={"torch_compile": True}, data={"seq_len": seq})
        assert search.search(ctx).loss_kernel == "chunked"
    cfg = C.validate({"model": {"architecture": "llama-3.2-1b"}, "speed": {"torch_compile": True}})
    assert loss_kernel.candidates(cfg, "llama", liger=True) == ["hf", "chunked"]


def test_explicit_values_win_and_are_judged(tmp_path, capsys):
    """An explicit kernel is kept; where it cannot run, the plan says so and Start refuses it with the same words."""
    chunked = _plan(tmp_path, capsys, "h100_training", "llama-3.2-1b", 2048, "speed.loss_kernel=chunked")
    assert "speed.loss_kernel" not in chunked["settings"]  # yours: not the planner's to set
    assert _loss_reason(chunked) == "loss: the chunked loss, as set (speed.loss_kernel)"
    gpt2 = _plan(tmp_path, capsys, "h100_training", "gpt2", 1024, "speed.loss_kernel=chunked")
    note = "speed.loss_kernel: chunked: the chunked loss is not exact for gpt2 models; use hf (or auto)"
    assert note in gpt2["notes"]
    cfg = C.validate({"model": {"architecture": "gpt2"}, "speed": {"loss_kernel": "chunked"}})
    hw = open_probe(str(FIX / "h100_training.jsonl")).snapshot()
    # Start refuses it with the same words, after the field ("speed.loss_kernel: ...", as preflight prints)
    assert [(r.field, f"{r.field}: {r.message}") for r in requirements.unmet(cfg, hw)] == [("speed.loss_kernel", note)]
    liger_cpu = _plan(tmp_path, capsys, "no_gpu", "demo-tiny-llama", 512, "speed.loss_kernel=liger")
    assert any("liger needs an NVIDIA GPU" in n for n in liger_cpu["notes"])
    compiled = search.search(_ctx("llama-3.2-1b", "h100_training", liger=True,
                                  speed={"loss_kernel": "liger", "torch_compile": True}))
    assert compiled.loss_kernel == "liger"  # judged, not changed: the plan notes the crash
    assert loss_kernel.compile_note(compiled_cfg := C.validate({"speed": {"loss_kernel": "liger", "torch_compile": True}}),
                                    "liger") and "illegal memory access" in loss_kernel.compile_note(compiled_cfg, "liger")


def test_liger_under_zero3_is_refused_and_never_chosen():
    zero3 = C.validate({"model": {"architecture": "llama-3.2-1b"}, "speed": {"loss_kernel": "liger"},
                        "deepspeed": {"enabled": True, "zero_stage": 3}})
    found = loss_kernel.problem("liger", zero3, "llama", "cuda", liger_installed=True)
    assert found.needs == "DeepSpeed ZeRO-2 or none" and "ZeRO-3 partitions" in found.message
    hf = loss_kernel.Outcome("liger", True, 3, "DeepSpeed ZeRO-3", 1, True, 10 * GIB, 1.0, 2048, zero3=True)
    ch = dataclasses.replace(hf, kernel="chunked")
    auto = C.validate({"model": {"architecture": "llama-3.2-1b"}})
    assert loss_kernel.decide(auto, {"liger": hf, "chunked": ch}, 20 * GIB, str).kernel == "chunked"


def test_other_objectives_compute_their_own_loss():
    dpo = C.validate({"model": {"architecture": "llama-3.2-1b"}, "training": {"objective": "dpo"}})
    assert loss_kernel.candidates(dpo, "llama", liger=True) == ["hf"]
    explicit = C.validate({"model": {"architecture": "llama-3.2-1b"}, "training": {"objective": "dpo"},
                           "speed": {"loss_kernel": "chunked"}})
    assert "DPO computes its own loss in TRL" in loss_kernel.problem("chunked", explicit, "llama", "cuda").message


def test_the_old_chunked_loss_key_reads_as_the_new_one():
    """Configs and run folders written before speed.loss_kernel keep their meaning (and count as set)."""
    off = C.validate({"speed": {"chunked_loss": False}})
    on = C.validate({"speed": {"chunked_loss": True}})
    assert off.speed.loss_kernel == "hf" and on.speed.loss_kernel == "chunked"
    assert "speed.loss_kernel" in C.explicit_keys(off)
    assert C.validate({"speed": {"chunked_loss": "auto"}}).speed.loss_kernel == "auto"
    both = C.validate({"speed": {"chunked_loss": False, "loss_kernel": "liger"}})
    assert both.speed.loss_kernel == "liger"  # the new key wins
    assert C.replace(C.validate({}), **{"speed.chunked_loss": False}).speed.loss_kernel == "hf"


def test_the_ladder_asks_the_same_rule():
    base = {"device": "cuda", "model": {"architecture": "llama-3.2-1b"}, "speed": {"loss_kernel": "hf"}}
    cfg = C.validate(base)
    assert loss_kernel.ladder_kernel(cfg, "llama", liger_installed=True) == "liger"
    assert loss_kernel.ladder_kernel(cfg, "llama", liger_installed=False) == "chunked"
    compiled = C.validate({**base, "speed": {"loss_kernel": "hf", "torch_compile": True}})
    assert loss_kernel.ladder_kernel(compiled, "llama", liger_installed=True) == "chunked"  # never Liger under compile
    assert loss_kernel.ladder_kernel(cfg, "gpt2") is None
    assert loss_kernel.ladder_kernel(C.validate({**base, "speed": {"loss_kernel": "chunked"}}), "llama") is None


def test_the_plan_counts_each_kernels_working_memory():
    """HF's loss holds the whole micro-batch's logits; the chunked loss one chunk and the head's gradient; Liger
    its 16-bit chunk (about as large as the hidden states) and the head's gradient."""
    spec = load_model_spec("llama-3.2-1b")
    setup = TrainSetup(micro_batch=8, seq_len=2048)
    loss = {k: estimate(spec, dataclasses.replace(setup, loss_kernel=k)).breakdown["logits_loss"]
            for k in loss_kernel.KERNELS}
    head_grad = 2 * spec.vocab * spec.hidden
    assert loss["hf"] == 8 * 8 * 2048 * spec.vocab
    assert loss["chunked"] == 8 * 520 * spec.vocab + head_grad
    assert loss["liger"] == 2 * 512 * spec.vocab + head_grad  # next power of two of 16,384 / ceil(128,256 / 2,048)


def test_no_second_list_of_loss_families():
    """The families each kernel is exact for live in loss_kernel.py only."""
    listed = re.compile(r"(CHUNKED_LOSS_FAMILIES|LIGER_FAMILIES|CHUNKED_FAMILIES)\s*=")
    homes = [p.relative_to(ROOT).as_posix() for p in (ROOT / "trainer").rglob("*.py") if listed.search(p.read_text())]
    assert homes == ["trainer/planning/loss_kernel.py"]


def test_the_speed_estimate_reproduces_the_h100_fit_it_was_made_from():
    """throughput.py's docstring: micro-batch 1 with checkpointing ran at 13.1k tokens/s on the H100, micro-batch 8
    without it at 40.9k (Llama-3.2-1B, seq 2048); the estimate says 3.05×, and checkpointing costs 27% compute. The
    time model (speed.py) reaches MFU (45%) at micro-batch 8 there, the figure it was set by."""
    spec = load_model_spec("llama-3.2-1b")
    small = TrainSetup(micro_batch=1, seq_len=2048, checkpointing=True)
    big = TrainSetup(micro_batch=8, seq_len=2048)
    h100 = speed.peak_flops("NVIDIA H100 80GB HBM3")

    def tokens_per_second(s):
        return s.micro_batch * s.seq_len / speed.compute_seconds(spec, s, h100)
    ratio = tokens_per_second(big) / tokens_per_second(small)
    assert ratio == pytest.approx(3.05, abs=0.01) and abs(ratio / (40.9 / 13.06) - 1) < 0.05
    assert tokens_per_second(big) * flops.flops_per_token(spec, big) / h100 == pytest.approx(speed.MFU, rel=1e-4)
    assert throughput.checkpointing_cost(spec, big) == pytest.approx(0.27, abs=0.01)
    assert throughput.half_busy_tokens(spec, big) == pytest.approx(throughput.HALF_BUSY_TOKENS, rel=1e-3)
    assert throughput.half_busy_tokens(load_model_spec("qwen2.5-7b"), big) < 1400  # larger models saturate sooner
