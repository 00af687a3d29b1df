"""DPO, KTO, ORPO, unpacked SFT and GRPO are planned on their data's longest tokenised sample (issue 31: a
preference set of ten-word records planned 12.3 GiB and used 6.4): the planner reads the statistics the data report,
GRPO's check and run's data_stats child store (``trainer.data.token_stats``), never tokenises itself, and says in
its reasons which length it planned at."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers_pref import pairs, pref_config
from helpers_train import cli, write_config, write_jsonl
from trainer import config as C
from trainer.data import token_stats
from trainer.hardware.source import open_probe
from trainer.planning.plan import plan_run

LAPTOP = Path(__file__).parent / "fixtures" / "hardware" / "rtx4090_laptop_16gb.jsonl"


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINPILOT_CACHE", str(tmp_path / "cache"))


def _cfg(tmp_path, objective="dpo", **sections):
    rows = pairs(16) if objective in ("dpo", "orpo") else \
        [{"prompt": p["prompt"], "completion": p["chosen"], "label": True} for p in pairs(16)]
    path = write_jsonl(tmp_path / f"{objective}.jsonl", rows)
    data = {"model": {"architecture": "qwen2.5-0.5b"}, "data": {"path": str(path), "seq_len": 2048},
            "training": {"objective": objective, "effective_batch_size": 16}, "method": {"type": "lora"}}
    for k, v in sections.items():
        data.setdefault(k, {}).update(v)
    return C.validate(data)


def _laptop():
    return open_probe(str(LAPTOP)).snapshot()


def test_dpo_without_measured_lengths_plans_at_seq_len_and_says_how_to_measure(tmp_path):
    plan = plan_run(_cfg(tmp_path), _laptop())
    assert any(r.startswith("memory is planned at data.seq_len 2048: the data's token lengths are not measured yet")
               and "trainpilot-cli data" in r for r in plan.reasons)


@pytest.mark.parametrize("objective", ["dpo", "orpo"])
def test_preference_plans_follow_the_longest_pair(tmp_path, objective):
    cfg = _cfg(tmp_path, objective)
    at_seq = plan_run(cfg, _laptop())
    token_stats.store(cfg, {"longest": 40, "records": 16})
    on_data = plan_run(cfg, _laptop())
    assert any(r == "memory is planned at 40 tokens per sequence: the data's longest prompt + answer (chosen or "
                    "rejected) is 40 tokens (data.seq_len 2048)" for r in on_data.reasons)
    mb_data, mb_seq = on_data.resolved.training.micro_batch_size, at_seq.resolved.training.micro_batch_size
    assert mb_data > mb_seq  # a bigger micro-batch: a faster run on the same card
    assert on_data.breakdown["activations"] / mb_data * 10 < at_seq.breakdown["activations"] / mb_seq
    assert on_data.resolved.data.seq_len == 2048  # the run still truncates at data.seq_len: only the plan changes


def test_kto_plans_for_its_kl_pairs_longest_prompt_plus_longest_completion(tmp_path):
    cfg = _cfg(tmp_path, "kto")
    token_stats.store(cfg, {"longest": 30, "longest_prompt": 20, "longest_completion": 25, "records": 16})
    plan = plan_run(cfg, _laptop())
    assert any(r.startswith("memory is planned at 45 tokens per sequence: the longest prompt + the longest completion")
               for r in plan.reasons)


def test_a_longer_sample_than_seq_len_is_planned_at_seq_len(tmp_path):
    cfg = _cfg(tmp_path, "dpo", data={"seq_len": 512})
    token_stats.store(cfg, {"longest": 900, "records": 16})
    plan = plan_run(cfg, _laptop())
    assert any(r.startswith("memory is planned at 512 tokens per sequence") and "900 tokens, cut to data.seq_len 512"
               in r for r in plan.reasons)


def test_packed_sft_is_planned_at_seq_len_and_unpacked_on_its_data(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": "a few words"}] * 8)
    base = {"model": {"architecture": "qwen2.5-0.5b"}, "data": {"path": str(path), "seq_len": 4096},
            "training": {"effective_batch_size": 16}}
    packed = C.validate(base)
    token_stats.store(packed, {"longest": 12, "records": 8})
    assert not token_stats.follows_data(packed) and token_stats.planned_length(packed).tokens == 4096
    unpacked = C.validate({**base, "data": {**base["data"], "packing": False}})
    token_stats.store(unpacked, {"longest": 12, "records": 8})
    assert token_stats.planned_length(unpacked).tokens == 12


def test_changed_data_or_tokenizer_is_a_new_entry(tmp_path):
    cfg = _cfg(tmp_path)
    token_stats.store(cfg, {"longest": 40})
    assert token_stats.load(cfg) == {"longest": 40}
    other_model = C.replace(cfg, **{"model.architecture": "llama-3.2-1b"})
    assert token_stats.load(other_model) is None
    path = Path(cfg.data.path)
    path.write_text(path.read_text() + json.dumps(pairs(1)[0]) + "\n")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert token_stats.load(cfg) is None


def test_grpo_update_is_planned_at_the_longest_prompt_plus_the_completion(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", [{"prompt": "2+2?", "answer": "4"}] * 8)
    cfg = C.validate({"model": {"architecture": "qwen2.5-0.5b"}, "data": {"path": str(path), "seq_len": 1024},
                      "training": {"objective": "grpo", "effective_batch_size": 16, "micro_batch_size": 4,
                                   "gradient_accumulation_steps": 4}, "method": {"type": "lora"},
                      "grpo": {"num_generations": 8, "max_completion_length": 256}, "rewards": {"exact_answer": 1.0}})
    at_seq = plan_run(cfg, _laptop())
    token_stats.store(cfg, {"longest_prompt": 14, "records": 8})
    plan = plan_run(cfg, _laptop())
    assert any(r.startswith("memory is planned at 270 tokens per sequence: the longest prompt (14 tokens) + "
                            "grpo.max_completion_length (256)") for r in plan.reasons)
    assert any("(micro-batch" in r and "× 270 tokens; TRL's fused head" in r for r in plan.reasons)
    assert plan.phases["update"]["peak_bytes"] < at_seq.phases["update"]["peak_bytes"]
    assert plan.phases["sampling"]["breakdown"]["generation_kv_cache"] <= \
        at_seq.phases["sampling"]["breakdown"]["generation_kv_cache"]


@pytest.mark.slow
def test_data_report_measures_and_run_plans_on_it(tmp_path):
    """The user's path: ``trainpilot-cli data`` measures the pairs with the run's tokenizer; ``plan`` then plans at
    the longest pair; a ``run`` whose micro-batch is the planner's measures a fresh file itself before planning."""
    env = {"TRAINPILOT_CACHE": os.environ["TRAINPILOT_CACHE"]}
    cfg = pref_config(tmp_path, "dpo", data={"seq_len": 256},
                      training={"micro_batch_size": "auto", "gradient_accumulation_steps": "auto", "max_steps": 2})
    path = write_config(tmp_path / "dpo.yaml", cfg)
    report = cli("data", path, "--json", "--examples", "0", env=env)
    assert report.returncode == 0, report.stderr
    longest = json.loads(report.stdout)["tokens"]["max"]
    assert 0 < longest < 256
    plan = cli("plan", path, "--json", env=env)
    assert plan.returncode == 0, plan.stderr
    assert any(r.startswith(f"memory is planned at {longest} tokens per sequence") for r in json.loads(plan.stdout)["reasons"])
    fresh = dict(cfg, data={**cfg["data"], "path": str(write_jsonl(tmp_path / "fresh.jsonl", pairs(32)))})
    run = cli("run", write_config(tmp_path / "fresh.yaml", fresh), "--run-dir", tmp_path / "run", "--quiet", env=env)
    assert run.returncode == 0, run.stderr
    reasons = json.loads((tmp_path / "run" / "plan.json").read_text())["reasons"]
    assert any(r.startswith("memory is planned at") and "tokens per sequence: the data's longest" in r for r in reasons)
