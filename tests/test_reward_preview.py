"""``python -m trainer.worker.probes.reward_preview``: the base model (the bundled tiny demo model, random weights)
answers a few prompts of a GSM8K-shaped file, the run's rewards score every answer, one JSON document comes out;
bad input exits 2 with one line naming the field, before the model loads."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers_train import REPO, tiny_config, write_config
from trainer.core import entrypoints

ROWS = [{"question": "Natalia sold 48 clips in April and half as many in May. How many in all?",
         "answer": "48 / 2 = 24; 48 + 24 = 72\n#### 72", "level": "easy"},
        {"question": "Weng earns $12 an hour and worked 50 minutes. How much did she earn?",
         "answer": "12 / 60 * 50 = 10\n#### 10", "level": "easy"},
        {"question": "Betty has half of $100; she gets $15 and $30. How much more does she need?",
         "answer": "100 - 50 - 15 - 30 = 5\n#### 5", "level": "hard"}]
# A user's reward file: one reads the completion (its length), one reads record fields as TRL hands them over.
REWARDS_PY = '''
def long_answer(prompts, completions, completion_ids=None, **kwargs):
    return [min(1.0, len(ids) / 16) for ids in completion_ids]


def knows_reference(prompts, completions, answer, level, **kwargs):
    return [1.0 if a == "72" and lv == "easy" else 0.0 for a, lv in zip(answer, level)]
'''


def _config(tmp_path, rows=ROWS, **rewards) -> str:
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = tiny_config(data={"path": str(data), "seq_len": 128, "packing": False},
                      training={"objective": "grpo", "effective_batch_size": 8, "micro_batch_size": 4,
                                "gradient_accumulation_steps": 2},
                      grpo={"num_generations": 4, "max_completion_length": 20, "temperature": 1.0},
                      rewards=rewards)
    return str(write_config(tmp_path / "config.yaml", cfg))


def _run(*args, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run(entrypoints.python_m(entrypoints.REWARD_PREVIEW, *args), capture_output=True, text=True,
                          cwd=cwd, timeout=300)


@pytest.mark.slow  # loads the tiny model and samples on the CPU: ~10 s on the 2-core machine
def test_preview_samples_and_scores_with_the_runs_rewards(tmp_path):
    reward_file = tmp_path / "my_rewards.py"
    reward_file.write_text(REWARDS_PY)
    cfg = _config(tmp_path, numeric_answer=1.0, format=0.5, python=str(reward_file),
                  python_weights={"knows_reference": 2.0})
    out = _run(cfg, "--prompts", "2", "--completions", "3")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [(f["name"], f["weight"]) for f in doc["functions"]] == [
        ("numeric_answer", 1.0), ("format", 0.5), ("long_answer", 1.0), ("knows_reference", 2.0)]
    assert len(doc["prompts"]) == 2 and [p["reference"] for p in doc["prompts"]] == ["72", "10"]
    assert doc["prompts"][0]["prompt"].startswith("Natalia sold 48 clips")  # the demo tokenizer has no template
    for p, expected_ref_score in zip(doc["prompts"], (1.0, 0.0)):
        assert len(p["completions"]) == 3
        for c in p["completions"]:
            r = c["rewards"]
            assert 0 < c["tokens"] <= 20 and c["stopped"] in ("end_of_turn", "max_length")
            assert r["long_answer"] == min(1.0, c["tokens"] / 16)  # scored on the completion ids sampled
            assert r["knows_reference"] == expected_ref_score      # record fields reach the functions
            assert r["numeric_answer"] in (0.0, 1.0) and r["format"] in (0.0, 1.0)
            total = r["numeric_answer"] + 0.5 * r["format"] + r["long_answer"] + 2.0 * r["knows_reference"]
            assert c["total"] == pytest.approx(total)
    texts = [c["text"] for p in doc["prompts"] for c in p["completions"]]
    assert len(set(texts)) > 1  # sampled, not one greedy answer repeated


PLAIN = [{"prompt": "2 + 2 =", "answer": "4"}, {"prompt": "3 + 4 =", "answer": "7"}]


@pytest.mark.parametrize("rows, rewards, args, field", [
    (ROWS, {}, (), "rewards"),                                                      # no reward at all
    (ROWS, {"python": "/nonexistent/rewards.py"}, (), "rewards.python"),            # a file that does not exist
    (PLAIN, {"exact_answer": 1.0, "answer_field": "solution"}, (), "'solution'"),    # no such reference field
    (ROWS, {"exact_answer": 1.0}, ("--prompts", "0"), "--prompts"),                 # a bad argument
])
def test_bad_input_exits_2_with_one_line_naming_the_field(tmp_path, rows, rewards, args, field):
    out = _run(_config(tmp_path, rows=rows, **rewards), *args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in out.stderr, out.stderr
    assert out.stdout == ""


def test_a_missing_config_exits_2(tmp_path):
    out = _run(str(tmp_path / "nope.yaml"))
    assert out.returncode == 2 and "nope.yaml" in out.stderr and "Traceback" not in out.stderr, out.stderr
