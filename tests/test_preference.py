"""Preference objectives and encoder-decoder models through the real CLI (``python -m trainer run``):
they train, learn, stop and resume exactly, climb the OOM ladder with the effective batch kept, and
refuse bad data with exit 2. Plus the light record reader, in-process."""
from __future__ import annotations

import json

import pytest
from helpers_pref import kto_records, pairs, pref_config, t5_config
from helpers_train import cli, events, losses, write_config, write_jsonl

from trainer.core.errors import UserError
from trainer.data.preference import read_preference_records
from trainer.rundir.events import read_status


def _run(tmp_path, name: str, cfg: dict, *extra, env=None):
    path = write_config(tmp_path / f"{name}.yaml", cfg)
    run = tmp_path / name
    proc = cli("run", path, "--run-dir", run, "--quiet", *extra, env=env)
    return proc, run


@pytest.mark.slow
def test_dpo_lora_learns_the_chosen_answer(tmp_path):
    proc, run = _run(tmp_path, "dpo", pref_config(tmp_path, "dpo", "lora"))
    assert proc.returncode == 0, proc.stderr
    steps = events(run, "step")
    assert len(steps) == 12 and read_status(run)["state"] == "finished"
    started = events(run, "run_started")[0]
    assert started["objective"] == "dpo" and started["reference_model"] == "adapters_disabled"
    acc = [s["reward_accuracy"] for s in steps]
    margin = [s["rewards_margin"] for s in steps]
    assert acc[0] <= 0.5 and min(acc[-4:]) >= 0.9, acc  # at step 1 policy = reference: no pair is preferred yet
    assert margin[-1] > margin[len(margin) // 2] > margin[0], margin
    assert all(s["rewards_chosen"] - s["rewards_rejected"] == pytest.approx(s["rewards_margin"], abs=1e-5)
               for s in steps)
    assert all(s["tokens_per_second"] and s["tokens_per_second"] > 0 for s in steps)
    assert (run / "final" / "adapter_model.safetensors").is_file()
    assert 'run "$HERE/config.yaml"' in (run / "launch.sh").read_text()  # the launch script re-runs this config
    assert "objective: dpo" in (run / "config.yaml").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dpo-full", "kto", "t5"])
def test_objective_trains_ten_steps(tmp_path, kind):
    if kind == "dpo-full":
        cfg = pref_config(tmp_path, "dpo", "full", training={"learning_rate": 1e-3})
    elif kind == "kto":
        cfg = pref_config(tmp_path, "kto", "lora")
    else:
        cfg = t5_config(tmp_path)
    proc, run = _run(tmp_path, kind, cfg)
    assert proc.returncode == 0, proc.stderr
    steps = events(run, "step")
    assert len(steps) >= 10 and read_status(run)["state"] == "finished"
    assert steps[-1]["loss"] < steps[0]["loss"]
    if kind == "dpo-full":
        assert events(run, "run_started")[0]["reference_model"] == "frozen_copy"
        assert steps[-1]["reward_accuracy"] == 1.0 and steps[-1]["rewards_margin"] > 1.0
    if kind == "kto":
        assert "kl" in steps[-1] and steps[-1]["rewards_chosen"] > steps[-1]["rewards_rejected"]
    if kind == "t5":
        assert events(run, "run_started")[0]["encoder_decoder"] is True
        assert (run / "final" / "model.safetensors").is_file()


@pytest.mark.slow
def test_orpo_runs_with_its_metrics(tmp_path):
    proc, run = _run(tmp_path, "orpo", pref_config(tmp_path, "orpo", "lora", training={"max_steps": 3}))
    assert proc.returncode == 0, proc.stderr
    steps = events(run, "step")
    assert len(steps) == 3 and all(k in steps[-1] for k in ("log_odds_ratio", "nll_loss", "reward_accuracy"))
    assert all(s["tokens_per_second"] > 0 for s in steps)  # real tokens of chosen and rejected counted
    assert events(run, "run_started")[0]["reference_model"] is None


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dpo", "t5"])
def test_stop_then_resume_reproduces_the_uninterrupted_run(tmp_path, kind):
    over = {"training": {"max_steps": 8}, "checkpoints": {"every_steps": 5}}
    cfg = pref_config(tmp_path, "dpo", "lora", **over) if kind == "dpo" else t5_config(tmp_path, **over)
    proc, full = _run(tmp_path, "full", cfg)
    assert proc.returncode == 0, proc.stderr
    proc, part = _run(tmp_path, "part", cfg, env={"TRAINPILOT_INJECT_STOP": "3"})
    assert proc.returncode == 0, proc.stderr
    assert read_status(part)["state"] == "stopped" and (part / "checkpoints" / "checkpoint-3").is_dir()
    proc = cli("resume", part, "--quiet")
    assert proc.returncode == 0, proc.stderr
    a, b = losses(full), losses(part)
    assert a.keys() == b.keys() == set(range(1, 9))
    for step in a:
        assert b[step] == pytest.approx(a[step], abs=1e-6), step
    if kind == "dpo":
        ma = {e["step"]: e["rewards_margin"] for e in events(full, "step")}
        mb = {e["step"]: e["rewards_margin"] for e in events(part, "step")}
        assert all(mb[s] == pytest.approx(ma[s], abs=1e-5) for s in ma)


@pytest.mark.slow
def test_oom_during_dpo_climbs_the_ladder_and_keeps_the_effective_batch(tmp_path):
    geometry = {"max_steps": 6, "micro_batch_size": 8, "gradient_accumulation_steps": 1, "effective_batch_size": 8}
    cfg = pref_config(tmp_path, "dpo", "lora", training=geometry, checkpoints={"every_steps": 2},
                      recovery={"ladder_keeps": []})  # the config sets the micro-batch; the ladder may change it
    # out of memory from step 3 on while the micro-batch holds more than 2 pairs: 8 → 4 (still) → 2
    proc, run = _run(tmp_path, "ladder", cfg, env={"TRAINPILOT_INJECT_OOM": "3:2"})
    assert proc.returncode == 0, proc.stderr
    retries = events(run, "retry")
    assert [r["changes"]["training.micro_batch_size"] for r in retries] == [4, 2]
    assert all(r["changes"]["training.micro_batch_size"] * r["changes"]["training.gradient_accumulation_steps"] == 8
               for r in retries)
    last = events(run, "step")[-1]
    assert last["micro_batch_size"] * last["gradient_accumulation_steps"] == 8
    direct_cfg = pref_config(tmp_path, "dpo", "lora", checkpoints={"every_steps": 2},
                             training=dict(geometry, micro_batch_size=2, gradient_accumulation_steps=4))
    proc, direct = _run(tmp_path, "direct", direct_cfg)
    assert proc.returncode == 0, proc.stderr
    a, b = losses(direct), losses(run)
    assert a.keys() == b.keys()
    for step in a:
        assert b[step] == pytest.approx(a[step], abs=1e-5), step


@pytest.mark.slow
def test_kto_data_for_a_dpo_run_is_refused_with_exit_2_before_training(tmp_path):
    cfg = pref_config(tmp_path, "dpo", "lora")
    cfg["data"]["path"] = str(write_jsonl(tmp_path / "kto.jsonl", kto_records(8)))
    proc, run = _run(tmp_path, "bad", cfg)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "kto.jsonl line 1" in proc.stderr and "'chosen'" in proc.stderr and "objective kto" in proc.stderr
    assert not run.exists()


# -- the light reader ---------------------------------------------------------------------------------
def test_reader_accepts_both_shapes_and_messages(tmp_path):
    rows = read_preference_records(str(write_jsonl(tmp_path / "p.jsonl", pairs(4))), "dpo")
    assert len(rows) == 4 and set(rows[0]) == {"prompt", "chosen", "rejected"}
    assert len(read_preference_records(str(write_jsonl(tmp_path / "k.jsonl", kto_records(4))), "kto")) == 4
    chat = [{"prompt": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant", "content": "hello"}],
             "rejected": [{"role": "assistant", "content": "go away"}]}]
    assert read_preference_records(str(write_jsonl(tmp_path / "c.jsonl", chat)), "orpo")[0]["chosen"][0]["role"]


@pytest.mark.parametrize("record,objective,needles", [
    ({"prompt": "a", "chosen": "b"}, "dpo", ["line 2", "'rejected'", "fields present: chosen, prompt"]),
    ({"prompt": "a", "completion": "b", "label": "yes"}, "kto", ["line 2", "'label'", "true (desirable)"]),
    ({"prompt": "a", "chosen": "b", "rejected": 5}, "dpo", ["line 2", "'rejected'", "text or a list of messages"]),
    ({"prompt": "a", "chosen": " ", "rejected": "c"}, "dpo", ["line 2", "'chosen'", "empty"]),
    ({"prompt": "a", "chosen": [{"role": "assistant", "content": "b"}], "rejected": "c"}, "dpo", ["mixes"]),
    ({"text": "just text"}, "kto", ["line 2", "objective sft"]),
    ({"prompt": "a", "chosen": "b", "rejected": "c"}, "kto", ["line 2", "objective dpo or orpo"]),
])
def test_reader_names_file_line_field_and_fix(tmp_path, record, objective, needles):
    good = kto_records(1)[0] if objective == "kto" else pairs(1)[0]
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(record) + "\n", encoding="utf-8")
    with pytest.raises(UserError) as info:
        read_preference_records(str(path), objective)
    msg = str(info.value)
    assert str(path) in msg and all(n in msg for n in needles), msg


def test_blank_lines_keep_line_numbers_true(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(pairs(1)[0]) + "\n\n\n" + json.dumps({"prompt": "x"}) + "\n", encoding="utf-8")
    with pytest.raises(UserError, match="line 4"):
        read_preference_records(str(path), "dpo")


def test_t5_without_templates_and_kto_with_micro_batch_1_are_refused_up_front(tmp_path):
    from trainer import config as config_mod
    from trainer.supervisor import preflight

    # question/answer records are a pair of their own (prompt_response); plain text holds no input and target
    cfg = t5_config(tmp_path)
    cfg["data"].pop("prompt_template"), cfg["data"].pop("response_template")
    preflight.check(config_mod.validate(cfg))
    cfg["data"]["path"] = str(write_jsonl(tmp_path / "text.jsonl", [{"text": p["prompt"] + p["chosen"]} for p in pairs()]))
    with pytest.raises(config_mod.ConfigError, match="prompt_template.*encoder-decoder"):
        preflight.check(config_mod.validate(cfg))
    kto = pref_config(tmp_path, "kto", "lora", training={"micro_batch_size": 1, "gradient_accumulation_steps": 8})
    with pytest.raises(config_mod.ConfigError, match="training.micro_batch_size.*KTO"):
        config_mod.validate(kto)
