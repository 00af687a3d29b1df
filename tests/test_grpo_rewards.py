"""GRPO's prompt datasets and rewards (trainer/data/prompts.py, trainer/data/rewards.py) and the pre-run check
(trainer/worker/probes/grpocheck.py) that refuses a bad reward file, a reward returning the wrong length, a dataset
without the reference field and a prompt too long, each with exit 2, one message and nothing written."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainer import config as config_mod
from trainer.core.errors import UserError
from trainer.data import prompts, rewards


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# -- prompt datasets --------------------------------------------------------------------------------
def test_prompt_and_gsm8k_shapes_are_detected_and_read(tmp_path):
    rows = [{"prompt": "2+2?", "answer": 4, "level": "easy"}, {"prompt": [{"role": "user", "content": "3+3?"}],
                                                               "answer": "6", "level": "easy"}]
    assert prompts.detect_prompt_shape(rows) == "prompt"
    got = prompts.read_prompt_records(str(_jsonl(tmp_path / "p.jsonl", rows)))
    assert got[0] == {"prompt": "2+2?", "answer": "4", "level": "easy"}  # references are text; other fields kept
    assert got[1]["prompt"][0]["role"] == "user"
    gsm = [{"question": "Tom has 3 apples and buys 1,000 more. How many?", "answer": "3 + 1000 = 1003\n#### 1,003"}]
    assert prompts.detect_prompt_shape(gsm) == "gsm8k"
    got = prompts.read_prompt_records(str(_jsonl(tmp_path / "g.jsonl", gsm)))
    assert got == [{"prompt": gsm[0]["question"], "answer": "1003", "solution": gsm[0]["answer"]}]
    assert prompts.detect_prompt_shape([{"prompt": "x", "chosen": "a", "rejected": "b"}]) is None
    assert prompts.detect_prompt_shape([{"text": "plain"}]) is None


@pytest.mark.parametrize("row, words", [
    ({"prompt": "q"}, ["line 2", "field 'answer'", "rewards.answer_field"]),
    ({"answer": "a"}, ["line 2", "field 'prompt' is missing"]),
    ({"prompt": "q", "chosen": "a", "rejected": "b"}, ["line 2", "dpo"]),
    ({"prompt": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "answer": "a"},
     ["line 2", "ends with an assistant message"]),
    ({"prompt": "q", "answer": {"x": 1}}, ["line 2", "text or a number"]),
])
def test_a_record_that_is_not_a_prompt_with_a_reference_is_refused_naming_its_line(tmp_path, row, words):
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": "ok", "answer": "1"}, row])
    with pytest.raises(UserError) as err:
        prompts.read_prompt_records(str(path))
    assert str(err.value).startswith("data.path: ") and all(w in str(err.value) for w in words), str(err.value)


def test_as_messages_puts_the_system_prompt_first_once():
    assert prompts.as_messages("hi", "Answer in tags.") == [{"role": "system", "content": "Answer in tags."},
                                                           {"role": "user", "content": "hi"}]
    own = [{"role": "system", "content": "mine"}, {"role": "user", "content": "hi"}]
    assert prompts.as_messages(own, "Answer in tags.") == own
    assert prompts.as_messages("hi") == [{"role": "user", "content": "hi"}]


# -- built-in rewards -------------------------------------------------------------------------------
def _cfg(**rewards_cfg):
    return config_mod.validate({"training": {"objective": "grpo", "effective_batch_size": 8},
                                "data": {"seq_len": 512}, "grpo": {"max_completion_length": 100},
                                "rewards": rewards_cfg})


def _by_name(cfg):
    return {r.name: r for r in rewards.reward_functions(cfg)}


def test_builtin_rewards_score_what_they_say():
    fns = _by_name(_cfg(exact_answer=1.0, numeric_answer=0.5, format=0.25, json_valid=1.0, length_penalty=1.0,
                        length_target=10))
    assert list(fns) == ["exact_answer", "numeric_answer", "format", "json_valid", "length_penalty"]
    completions = ["<think>easy</think> <answer> Paris </answer>", "paris", "<answer>Lyon</answer>",
                   "The answer is 1,003.", "#### 1003.0000001", '{"a": 1}', "```json\n[1, 2]\n```", "{bad"]
    refs = ["paris", "paris", "paris", "1003", "1003", "x", "x", "x"]
    score = lambda name: fns[name].func(prompts=["q"] * 8, completions=completions, answer=refs)  # noqa: E731
    assert score("exact_answer") == [1, 1, 0, 0, 0, 0, 0, 0]  # tags, else the whole text; case and spaces ignored
    assert score("numeric_answer") == [0, 0, 0, 1, 1, 0, 0, 0]  # the last number; relative tolerance 1e-6
    assert score("format") == [1, 0, 0, 0, 0, 0, 0, 0]
    assert score("json_valid") == [0, 0, 0, 0, 1, 1, 1, 0]  # "#### 1003.0000001": the answer after #### is a number
    ids = [[0] * n for n in (5, 10, 11, 55, 100, 200, 0, 1)]
    got = fns["length_penalty"].func(prompts=["q"] * 8, completions=completions, completion_ids=ids, answer=refs)
    assert got == pytest.approx([0, 0, -1 / 90, -0.5, -1, -1, 0, 0])
    conversational = [[{"role": "assistant", "content": "<answer>paris</answer>"}]]
    assert fns["exact_answer"].func(prompts=[[{"role": "user", "content": "q"}]], completions=conversational,
                                    answer=["Paris"]) == [1.0]


def test_answer_pattern_extracts_and_bad_patterns_name_their_field():
    fns = _by_name(_cfg(exact_answer=1.0, answer_pattern=r"Final: (\w+)"))
    assert fns["exact_answer"].func(prompts=["q", "q"], completions=["Final: Rome", "Rome"], answer=["rome"] * 2) == [1, 0]
    with pytest.raises(UserError, match=r"^rewards.answer_pattern: "):
        rewards.reward_functions(_cfg(exact_answer=1.0, answer_pattern="(unclosed"))
    with pytest.raises(UserError, match=r"^rewards.format_pattern: "):
        rewards.reward_functions(_cfg(format=1.0, format_pattern="[x"))
    with pytest.raises(UserError, match=r"^rewards.answer_field: .*'solution'"):
        _by_name(_cfg(exact_answer=1.0, answer_field="solution"))["exact_answer"].func(
            prompts=["q"], completions=["a"], answer=["a"])


# -- the user's Python rewards ----------------------------------------------------------------------
GOOD = '''
import math
WEIGHT = 3

def tagged(prompts, completions, **kwargs):
    return [1.0 if "<answer>" in c else 0.0 for c in completions]

def long_enough(completions, completion_ids=None, **kwargs):
    return [None if not ids else min(1.0, len(ids) / 10) for ids in completion_ids]

def _private(x):
    return x
'''


def test_a_python_file_gives_its_public_functions_in_order_with_weights(tmp_path):
    f = tmp_path / "r.py"
    f.write_text(GOOD)
    got = rewards.load_python_rewards(str(f), {"long_enough": 0.5})
    assert [(r.name, r.weight, r.builtin) for r in got] == [("tagged", 1.0, False), ("long_enough", 0.5, False)]
    assert got[0].func.__name__ == "tagged"
    out = rewards.score(got, ["p", "p"], ["<answer>x</answer>", "y"], completion_ids=[[1] * 20, []])
    assert out == {"rewards": {"tagged": [1.0, 0.0], "long_enough": [1.0, None]}, "total": [1.5, 0.0]}


@pytest.mark.parametrize("source, weights, words", [
    ("def f(prompts, completions):\n    return []\n", {}, ["f in", "**kwargs"]),
    ("async def f(prompts, completions, **kw):\n    return []\n", {}, ["f in", "plain def"]),
    ("def format(prompts, completions, **kw):\n    return []\n", {}, ["format in", "built-in", "my_format"]),
    ("def f(prompts, completions, **kw)\n    return []\n", {}, ["line 1", "syntax error"]),
    ("import not_a_module_here\n", {}, ["line 1", "not_a_module_here", "pip install"]),
    ("x = 1 / 0\n", {}, ["line 1", "ZeroDivisionError"]),
    ("X = 1\n", {}, ["defines no public function"]),
    ("def f(prompts, completions, **kw):\n    return []\n", {"g": 2.0}, ["rewards.python_weights", "g is not"]),
])
def test_a_bad_python_file_is_refused_naming_the_function_and_the_problem(tmp_path, source, weights, words):
    f = tmp_path / "bad.py"
    f.write_text(source)
    with pytest.raises(UserError) as err:
        rewards.load_python_rewards(str(f), weights)
    text = str(err.value)
    assert text.startswith("rewards.python") and all(w in text for w in words), text


@pytest.mark.parametrize("body, words", [
    ("return [1.0]", ["returned 1 value(s) for 8 completions"]),
    ("return 1.0", ["returned float, not a list"]),
    ("return ['yes'] * len(completions)", ["returned 'yes' for completion 1"]),
    ("return [float('nan')] * len(completions)", ["returned nan"]),
    ("raise KeyError('answer')", ["raised KeyError", "line 2"]),
])
def test_a_reward_returning_the_wrong_thing_fails_the_dry_run(tmp_path, body, words):
    f = tmp_path / "r.py"
    f.write_text(f"def r(prompts, completions, **kwargs):\n    {body}\n")
    records = [{"prompt": f"q{i}", "answer": str(i)} for i in range(5)]
    with pytest.raises(UserError) as err:
        rewards.dry_run(rewards.load_python_rewards(str(f)), records, "answer")
    assert all(w in str(err.value) for w in words), str(err.value)


def test_the_dry_run_calls_rewards_as_trl_does(tmp_path):
    f = tmp_path / "r.py"
    f.write_text("def r(prompts, completions, answer, trainer_state=None, **kwargs):\n"
                 "    assert len(answer) == len(completions) and 'prompt' not in kwargs\n"
                 "    kwargs['log_metric']('x', 1.0)\n"
                 "    return [1.0 if a in c else 0.0 for a, c in zip(answer, completions)]\n")
    rewards.dry_run(rewards.load_python_rewards(str(f)), [{"prompt": "q", "answer": "42"}], "answer")


# -- the pre-run check, end to end through the CLI ----------------------------------------------------
def _run_cli(tmp_path: Path, data_rows: list[dict], reward_py: str | None = None, **over) -> subprocess.CompletedProcess:
    data = _jsonl(tmp_path / "prompts.jsonl", data_rows)
    cfg = {"name": "g", "device": "cpu", "data": {"path": str(data), "seq_len": 64},
           "training": {"objective": "grpo", "effective_batch_size": 4, "max_steps": 1},
           "grpo": {"num_generations": 2, "max_completion_length": 16},
           "rewards": {"exact_answer": 1.0}, "output": {"runs_dir": str(tmp_path / "runs")}}
    if reward_py is not None:
        (tmp_path / "mine.py").write_text(reward_py)
        cfg["rewards"]["python"] = str(tmp_path / "mine.py")
    for key, value in over.items():
        section, name = key.split("__")
        cfg[section][name] = value
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    return subprocess.run([sys.executable, "-m", "trainer", "run", str(tmp_path / "c.yaml")], capture_output=True,
                          text=True, cwd=tmp_path, timeout=300)


GOOD_ROWS = [{"prompt": f"Repeat the first word: w{i} v{i}", "answer": f"w{i}"} for i in range(4)]


@pytest.mark.slow  # a CLI child each, with the tokenizer check (4-5 s)
@pytest.mark.parametrize("case", ["wrong_length", "no_reference", "prompt_too_long"])
def test_bad_grpo_inputs_exit_2_with_one_message_and_write_nothing(tmp_path, case):
    if case == "wrong_length":
        proc = _run_cli(tmp_path, GOOD_ROWS, "def short(prompts, completions, **kwargs):\n    return [0.0]\n")
        words = ["rewards.python: short in", "returned 1 value(s)"]
    elif case == "no_reference":
        proc = _run_cli(tmp_path, GOOD_ROWS[:2] + [{"prompt": "Repeat the first word: a b"}])
        words = ["data.path:", "line 3", "field 'answer'"]
    else:
        proc = _run_cli(tmp_path, GOOD_ROWS, data__seq_len=20)
        words = ["data.path:", "line 1", "leaves 4", "data.skip_bad_lines"]
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_vllm_and_early_stopping_are_refused_before_a_grpo_run_starts(monkeypatch):
    from trainer.core import capabilities
    from trainer.planning import requirements

    monkeypatch.setattr(capabilities, "installed", lambda name: name != "vllm")
    cfg = config_mod.validate({"training": {"objective": "grpo", "effective_batch_size": 8},
                               "grpo": {"use_vllm": True}, "rewards": {"format": 1.0}})
    assert [(r.field, r.needs) for r in requirements.unmet(cfg)] == [("grpo.use_vllm", "vLLM")]
    with pytest.raises(config_mod.ConfigError) as err:
        config_mod.validate({"training": {"objective": "grpo", "effective_batch_size": 8, "eval_every_steps": 2},
                             "data": {"validation_split": 0.1}, "evaluation": {"early_stopping_patience": 2},
                             "rewards": {"format": 1.0}})
    assert err.value.problems[0][0] == "evaluation.early_stopping_patience"


def test_clip_higher_and_gspo_without_a_second_update_are_refused_naming_the_field():
    """They act on the policy ratio, exactly 1 while every step samples afresh (num_iterations 1): refused, not
    silently ignored; an upper bound below the lower one is refused too."""
    base = {"training": {"objective": "grpo", "effective_batch_size": 8}, "rewards": {"format": 1.0}}
    for grpo, field, words in (({"epsilon_high": 0.28}, "grpo.epsilon_high", "num_iterations: 2"),
                               ({"importance_sampling_level": "sequence"}, "grpo.importance_sampling_level",
                                "num_iterations: 2"),
                               ({"epsilon_high": 0.1, "num_iterations": 2}, "grpo.epsilon_high", "below grpo.epsilon")):
        with pytest.raises(config_mod.ConfigError) as err:
            config_mod.validate({**base, "grpo": grpo})
        assert [p[0] for p in err.value.problems] == [field] and words in err.value.problems[0][1], err.value.problems
    ok = config_mod.validate({**base, "grpo": {"num_iterations": 2, "epsilon_high": 0.28,
                                               "importance_sampling_level": "sequence"}})
    assert (ok.grpo.num_iterations, ok.grpo.epsilon_high) == (2, 0.28)


def test_rewards_names_are_read_off_the_schema():
    """One home: the built-in rewards are the RewardsConfig fields marked as weights, in schema order."""
    names = config_mod.RewardsConfig.builtin_names()
    assert names == rewards.BUILTIN_NAMES == ("exact_answer", "numeric_answer", "format", "json_valid",
                                              "length_penalty")
    assert all(config_mod.RewardsConfig.model_fields[n].annotation is float for n in names)


def test_the_dry_run_hands_message_prompts_conversational_completions(tmp_path):
    """Under a chat template the worker gives TRL message prompts, and TRL hands rewards completions as
    [{"role": "assistant", "content": ...}]: the pre-run check calls them the same way (grpocheck renders first)."""
    f = tmp_path / "r.py"
    f.write_text("def content_len(prompts, completions, **kwargs):\n"
                 "    return [float(len(c[0]['content'])) for c in completions]\n")
    rows = [{"prompt": [{"role": "user", "content": "q"}], "answer": "42"}]
    rewards.dry_run(rewards.load_python_rewards(str(f)), rows, "answer")
    with pytest.raises(UserError, match="raised TypeError"):
        rewards.dry_run(rewards.load_python_rewards(str(f)), [{"prompt": "q", "answer": "42"}], "answer")
