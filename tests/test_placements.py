"""Issue 45: one table of optimizer-state placements (trainer/config/placements.py). Every reader covers exactly the
table's names, the names are spelled nowhere else in the code, and the Method page's per-placement verdicts apply
the requirements check the one-verdict function applies (no "fits" for a bitsandbytes placement without it)."""
from __future__ import annotations

import re
import sys
import typing
from pathlib import Path

import pytest
from test_plan_in_backward import LAPTOP, cfg, hw

from trainer import config as C
from trainer.config import placements
from trainer.config.placements import DEFAULT, NAMES, PLACEMENTS, placement
from trainer.planning import requirements, search_space, verdict

ROOT = Path(__file__).parents[1]


def test_the_configs_choices_and_description_are_the_tables():
    field = C.TrainingConfig.model_fields["optimizer"]
    assert typing.get_args(field.annotation) == NAMES and field.default == DEFAULT
    assert all(f"{p.name}: {p.doc}" in field.description for p in PLACEMENTS)
    assert "training.optimizer" in (ROOT / "README.md").read_text() and all(p.doc for p in PLACEMENTS)


def test_every_row_has_its_words_and_its_requirements():
    assert len(set(NAMES)) == len(NAMES) == len(PLACEMENTS)
    for p in PLACEMENTS:
        assert p.placed and p.states and p.doc
        assert bool(p.saver) == (p.name != DEFAULT)  # the default is no memory saver; every other one names itself
        assert (p.hf_optim is None) == (p.bnb_class is None) == (p.package is None) == (p.name == DEFAULT)
        assert p.exact == (not p.eight_bit) and (p.state_width == 1) == p.eight_bit


@pytest.mark.slow  # imports transformers' TrainingArguments and bitsandbytes (8 s of CPU)
def test_every_rows_optimizer_is_one_hf_and_bitsandbytes_build():
    hf_names = {o.value for o in pytest.importorskip("transformers.training_args").OptimizerNames}
    assert all(p.hf_optim in hf_names for p in PLACEMENTS if p.hf_optim)
    bnb = pytest.importorskip("bitsandbytes")
    assert all(hasattr(bnb.optim, p.bnb_class) for p in PLACEMENTS if p.bnb_class)


def test_requirements_and_cross_checks_cover_exactly_the_tables_packages(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    for p in PLACEMENTS:
        needs = [r.needs for r in requirements.unmet(cfg("llama-3.2-1b", training={"optimizer": p.name}))
                 if r.field == "training.optimizer"]
        assert needs == ([p.package] if p.package else []), p.name
        refused = True
        try:
            cfg("llama-3.2-1b", device="cpu", training={"optimizer": p.name})
        except C.ConfigError as exc:
            assert "training.optimizer" in str(exc)
        else:
            refused = False
        assert refused == p.cuda_only, p.name


def test_the_method_pages_options_and_the_search_read_the_table():
    keys = [o[0] for o in verdict.STEP_OPTIONS]
    assert keys == ["separate", *NAMES]
    for key, words, changes, approximate, consequence in verdict.STEP_OPTIONS[1:]:
        p = placement(key)
        assert words.endswith(p.placed) and changes["training.optimizer"] == key and approximate == (not p.exact)
        assert ("PCIe" in consequence) == p.paged
    assert search_space.level_words(((False, 2, False, False), False, DEFAULT)) == ""
    for p in PLACEMENTS[1:]:
        assert search_space.level_words(((False, 2, False, False), False, p.name)) == p.saver


def test_the_names_are_spelled_only_in_the_table():
    """A placement added in one place only: its name would be spelled there, outside the table."""
    spelled = re.compile("|".join([r"""["']adamw["']""", *(re.escape(n) for n in NAMES[1:])]))
    found = []
    for path in [*(ROOT / "trainer").rglob("*.py"), *(ROOT / "app").rglob("*.py")]:
        if path == Path(placements.__file__):
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if spelled.search(re.sub(r"\w+_adamw_8bit_\w+", "", line)):
                found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not found, "\n".join(found)


def test_step_options_say_needs_bitsandbytes_where_it_is_missing(monkeypatch, cuda_torch):
    """The Method page's per-placement verdicts apply the one verdict's requirements check: without bitsandbytes a
    placement of bitsandbytes' reads "needs bitsandbytes" (not "fits"), and the one click never offers it."""
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    options = verdict.step_options(cfg("qwen2.5-0.5b", method={"type": "full"}, data={"seq_len": 512},
                                       plan_allow_approximate=True), hw(LAPTOP))
    by_key = {o.key: o for o in options}
    assert set(by_key) == {"separate", *NAMES}
    assert by_key[DEFAULT].verdict == "fits" and by_key["separate"].verdict == "fits"
    for p in PLACEMENTS:
        if p.package:
            o = by_key[p.name]
            assert (o.verdict, o.needs, o.verdict_words) == ("needs", ("bitsandbytes",), "needs bitsandbytes"), o
            assert o.peak_bytes is not None  # the memory is still said
    assert verdict.one_click_offer(options) is None
