"""One fit verdict (trainer/planning/verdict.py) for the model page, the picker and the plan page, and
"alternatives" that name real models of the same kind (trainer/models/catalog.py)."""
from __future__ import annotations

import sys

import pytest

from trainer import config as tc
from trainer.core import capabilities
from trainer.core.paths import MODELS_DIR
from trainer.hardware.source import open_probe
from trainer.models import catalog
from trainer.models.spec import load_model_spec
from trainer.planning.plan import plan_run
from trainer.planning.verdict import METHODS, VERDICTS, method_verdict, model_verdict

FIXTURES = MODELS_DIR.parents[2] / "tests" / "fixtures" / "hardware"


def _snapshot(name: str):
    probe = open_probe(str(FIXTURES / name))
    try:
        return probe.snapshot()
    finally:
        probe.close()


LAPTOP = _snapshot("rtx4090_laptop_16gb.jsonl")
NO_GPU = _snapshot("no_gpu.jsonl")


def test_every_shipped_architecture_is_a_real_model_or_a_test_shape_of_its_kind():
    shipped = {p.stem for p in MODELS_DIR.glob("*.json")}
    assert shipped == set(catalog.HUB_IDS) | set(catalog.TEST_ARCHITECTURES)
    for arch, repo in catalog.HUB_IDS.items():
        assert load_model_spec(arch).encoder_decoder is (arch in catalog.ENCODER_DECODER), arch
        assert catalog.architecture_of(repo) == arch and catalog.architecture_of(repo.upper()) == arch
        assert load_model_spec(repo).params == load_model_spec(arch).params  # a hub id plans as its shape
    assert catalog.architecture_of("demo-tiny-llama") == "tiny-llama"
    assert all(catalog.hub_id(a) is None for a in catalog.TEST_ARCHITECTURES)


def test_the_model_page_the_picker_and_the_plan_page_get_one_answer():
    cfg = tc.RunConfig()  # a 3B model on the 16 GB laptop: full does not fit, LoRA does
    by_id = model_verdict(cfg, LAPTOP, "meta-llama/Llama-3.2-3B")
    by_shape = model_verdict(cfg, LAPTOP, "llama-3.2-3b")
    assert set(by_id.methods) == set(METHODS) and by_id.params == by_shape.params > 1e9
    for method in METHODS:
        a, b = by_id.methods[method], by_shape.methods[method]
        assert (a.verdict, a.peak_bytes, a.budget_bytes) == (b.verdict, b.peak_bytes, b.budget_bytes), method
        assert a.verdict in VERDICTS and a.budget_bytes > 0
        plan_page = method_verdict(plan_run(tc.replace(cfg, **{"model.source": "meta-llama/Llama-3.2-3B",
                                                               "method.type": method}), LAPTOP), LAPTOP)
        assert (plan_page.verdict, plan_page.peak_bytes) == (a.verdict, a.peak_bytes), method
    full, lora = by_id.methods["full"], by_id.methods["lora"]
    assert full.peak_bytes > lora.peak_bytes and not full.fits and lora.fits
    assert by_id.best().method == "lora"


def test_qlora_needs_what_start_would_refuse_without(monkeypatch, cuda_torch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    qlora = model_verdict(tc.RunConfig(), LAPTOP, "Qwen/Qwen2.5-7B", methods=("qlora",)).methods["qlora"]
    assert (qlora.verdict, qlora.needs, qlora.words) == ("needs", ("bitsandbytes",), "needs bitsandbytes")
    assert qlora.peak_bytes < qlora.budget_bytes and not qlora.fits
    assert any("pip install bitsandbytes" in r for r in qlora.reasons)
    on_cpu = model_verdict(tc.RunConfig(), NO_GPU, "smollm-135m", methods=("qlora",)).methods["qlora"]
    assert on_cpu.verdict == "needs" and on_cpu.needs[0] == "an NVIDIA GPU"


@pytest.mark.skipif(not capabilities.installed("bitsandbytes"), reason="bitsandbytes is not installed here")
def test_qlora_fits_where_bitsandbytes_is_installed(cuda_torch):
    assert model_verdict(tc.RunConfig(), LAPTOP, "Qwen/Qwen2.5-7B").methods["qlora"].fits


def test_a_model_without_a_config_is_judged_unknown_with_the_reason():
    v = model_verdict(tc.RunConfig(), LAPTOP, "nobody/not-a-model-here")
    assert v.methods == {} and "is not downloaded" in v.error and v.best() is None


@pytest.mark.parametrize("source, kind", [("Qwen/Qwen2.5-7B", catalog.CAUSAL),
                                          ("google/flan-t5-xl", catalog.ENCODER_DECODER)])
def test_alternatives_name_real_models_of_the_same_kind(source, kind):
    cfg = tc.replace(tc.RunConfig(), **{"model.source": source, "method.type": "full", "data.seq_len": 512})
    plan = plan_run(cfg, LAPTOP)
    assert plan.verdict == "does_not_fit"
    smaller = [a for a in plan.alternatives if a["description"].startswith("a smaller model")]
    assert smaller, [a["description"] for a in plan.alternatives]
    for alt in smaller:
        assert alt["settings"]["model.source"] in kind.values() and alt["settings"]["model.architecture"] is None
        assert alt["fits"]
    text = " ".join(a["description"] for a in plan.alternatives)
    assert "tiny" not in text and ("t5" in text) is (kind is catalog.ENCODER_DECODER)
