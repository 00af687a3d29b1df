"""One answer (issue 41, walkthrough finding 5): ``plan`` measures what ``run`` measures before it plans. A DPO run's
memory follows its longest pair; ``plan`` used to plan it at data.seq_len ("the data's token lengths are not measured
yet") while ``run`` measured first and ran another plan. Now ``plan`` starts the same measurement (the data_stats
child, stored by the data's fingerprint), and the ``run`` after it reuses the entry: the plan printed is plan.json."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers_pref import pref_config
from helpers_train import cli, write_config
from trainer import config as C
from trainer.data import token_stats

NO_GPU = Path(__file__).parent / "fixtures" / "hardware" / "no_gpu.jsonl"  # fixed host RAM: both plan the same


@pytest.mark.slow  # the measurement child, then a 2-step DPO run
def test_plan_of_unmeasured_dpo_data_plans_at_its_measured_length_and_is_the_plan_run_writes(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINPILOT_CACHE", str(tmp_path / "cache"))
    env = {"TRAINPILOT_CACHE": os.environ["TRAINPILOT_CACHE"]}
    data = pref_config(tmp_path, "dpo", data={"seq_len": 256},
                       training={"micro_batch_size": "auto", "gradient_accumulation_steps": "auto", "max_steps": 2})
    path = write_config(tmp_path / "dpo.yaml", data)
    assert token_stats.load(C.load(path)) is None  # unmeasured
    plan = cli("plan", path, "--json", "--hardware", NO_GPU, env=env)
    assert plan.returncode == 0, plan.stderr
    assert "measuring the data's token lengths" in plan.stderr
    entry = token_stats.load(C.load(path))
    assert entry is not None and 0 < entry["longest"] < 256, entry
    printed = json.loads(plan.stdout)
    assert f"memory is planned at {entry['longest']} tokens per sequence: the data's longest prompt + answer " \
           f"(chosen or rejected) is {entry['longest']} tokens (data.seq_len 256)" in printed["reasons"]
    assert not any("not measured yet" in r for r in printed["reasons"])
    stored = token_stats._file(token_stats.key(C.load(path)))
    measured_at = stored.stat().st_mtime_ns
    again = cli("plan", path, "--json", "--hardware", NO_GPU, env=env)  # the entry is reused: no second child
    assert again.returncode == 0 and "measuring" not in again.stderr and json.loads(again.stdout) == printed
    run = cli("run", path, "--hardware", NO_GPU, "--run-dir", tmp_path / "run", "--quiet", env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert stored.stat().st_mtime_ns == measured_at  # run measured nothing anew
    written = json.loads((tmp_path / "run" / "plan.json").read_text())
    printed.pop("method_verdict")  # plan's words for the wizard's verdict; not part of plan.json
    assert written == printed
