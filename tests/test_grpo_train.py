"""GRPO (training.objective: grpo) through the real CLI (``python -m trainer run``) on a tiny word-level model
(helpers_grpo): it learns a rule from rewards alone, warns when no answer ever scores, stops and resumes exactly
(sampling included), trains LoRA adapters under a chat template, and refuses bad prompts with exit 2.
Plus the light pieces in-process: step-metric names, the warning's wording, TRL's overridden methods."""
from __future__ import annotations

import ast
import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers_grpo import grpo_config, last_word_records
from helpers_train import cli, events, write_config, write_jsonl

from trainer.rundir.events import read_status


def _run(tmp_path, name: str, cfg: dict, *extra, env=None):
    path = write_config(tmp_path / f"{name}.yaml", cfg)
    run = tmp_path / name
    proc = cli("run", path, "--run-dir", run, "--quiet", *extra, env=env)
    return proc, run


def _mean(xs) -> float:
    return sum(xs) / len(xs)


# -- through the CLI ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_grpo_learns_the_last_word_from_the_exact_answer_reward(tmp_path):
    """The word model starts at chance (1 in 18 tokens) and learns to answer the prompt's last word. Measured
    (2-core CPU, seed 7, 40 steps of 4 prompts x 8 answers, lr 1e-2; 10 s for the run, 17 s for the test):
    mean reward of steps 1-5 0.100, of steps 36-40 0.919 (0.94-1.0 from step 26 on, 0.69 at step 40); every
    sample event carries its rewards and advantage."""
    cfg = grpo_config(tmp_path, training={"max_steps": 40}, checkpoints={"every_steps": 100})
    proc, run = _run(tmp_path, "learn", cfg)
    assert proc.returncode == 0, proc.stderr
    steps = events(run, "step")
    assert len(steps) == 40 and read_status(run)["state"] == "finished"
    rewards = [s["reward"] for s in steps]
    first, last = _mean(rewards[:5]), _mean(rewards[-5:])
    assert first < 0.3 and last > 0.8 and last - first > 0.5, rewards
    for s in steps:
        assert s["rewards"]["exact_answer"]["mean"] == pytest.approx(s["reward"])  # the only reward, weight 1
        assert set(s["rewards"]["exact_answer"]) == {"mean", "std"}
        assert 0 <= s["no_signal_fraction"] <= 1 and 0 <= s["completion_clipped"] <= 1
        assert s["completion_length"] == 1.0 and s["entropy"] > 0 and s["tokens_per_second"] > 0
        assert "kl" not in s  # beta 0: no reference model, no KL
    started = events(run, "run_started")[0]
    assert started["objective"] == "grpo" and started["reward_functions"] == ["exact_answer"]
    assert started["reward_weights"] == [1.0] and started["num_generations"] == 8
    assert started["generation_batch_size"] == 32 and started["reference_model"] is None
    samples = events(run, "sample")
    assert len(samples) == 80 and all(e["source"] == "grpo" for e in samples)  # samples_per_step 2
    for e in samples:
        assert e["prompt"].startswith("last: ") and e["tokens"] == 1
        assert e["reward"] == e["rewards"]["exact_answer"] == (1.0 if e["text"] == e["prompt"].split()[-1] else 0.0)
    late = [e for e in samples if e["step"] > 30]
    assert _mean([e["reward"] for e in late]) > 0.5
    assert not events(run, "warning")
    assert (run / "final" / "model.safetensors").is_file()
    assert not list((run / "checkpoints").rglob("*.parquet"))  # TRL's completion tables stay off


@pytest.mark.slow
def test_a_reward_that_never_scores_warns_no_learning_signal(tmp_path):
    """Every reference is a word the model cannot say: every group scores 0 at every step. One prompt is too long
    for seq_len - max_completion_length and skip_bad_lines is on: it is skipped, and said so."""
    rows = [dict(r, answer="purple") for r in last_word_records(16)]
    rows.insert(3, {"prompt": "last: " + " ".join(["red"] * 20), "answer": "red"})  # 21 tokens > 16 - 1
    cfg = grpo_config(tmp_path, rows=rows, training={"max_steps": 4}, data={"skip_bad_lines": True},
                      grpo={"no_signal_steps": 3, "samples_per_step": 1}, checkpoints={"every_steps": 100})
    proc, run = _run(tmp_path, "flat", cfg)
    assert proc.returncode == 0, proc.stderr
    steps = events(run, "step")
    assert [s["no_signal_fraction"] for s in steps] == [1.0] * 4 and all(s["reward"] == 0 for s in steps)
    warnings = {w["code"]: w for w in events(run, "warning")}
    assert set(warnings) == {"no_learning_signal", "skipped_lines"}
    flat = [w for w in events(run, "warning") if w["code"] == "no_learning_signal"]
    assert len(flat) == 1  # once, not at every later step
    assert "for 3 steps every answer in 100% of groups scored the same (every answer scores 0)" in flat[0]["message"]
    assert "left out 1 prompt(s) of" in warnings["skipped_lines"]["message"]
    assert "(first: line 4)" in warnings["skipped_lines"]["message"]
    assert events(run, "run_started")[0]["train_samples"] == 16
    assert [e["step"] for e in events(run, "sample")] == [1, 2, 3, 4]


@pytest.mark.slow
def test_stop_then_resume_reproduces_the_uninterrupted_run(tmp_path):
    """12 prompts = 3 steps an epoch, two sampling passes per step (generation_batch_size 16 of 32), beta > 0 (a
    frozen reference, so the loss carries a KL term and is not ~0): stopped at step 4 (epoch 2, mid-way) and
    resumed, every step's rewards, loss, KL and gradient norm equal the uninterrupted run's. Measured max
    difference 0 (bit-identical; also for LoRA + chat template, checked by hand); without the epoch-seeded prompt
    order (grpo.EpochRepeatSampler) the resumed run drew epoch 1's prompts again and step 5's mean reward differed
    by 0.22."""
    cfg = grpo_config(tmp_path, rows=last_word_records(12), training={"max_steps": 8},
                      grpo={"generation_batch_size": 16, "beta": 0.04}, checkpoints={"every_steps": 100})
    proc, full = _run(tmp_path, "full", cfg)
    assert proc.returncode == 0, proc.stderr
    proc, part = _run(tmp_path, "part", cfg, env={"TRAINPILOT_INJECT_STOP": "4"})
    assert proc.returncode == 0, proc.stderr
    assert read_status(part)["state"] == "stopped" and (part / "checkpoints" / "checkpoint-4").is_dir()
    proc = cli("resume", part, "--quiet")
    assert proc.returncode == 0, proc.stderr
    a = {e["step"]: e for e in events(full, "step")}
    b = {e["step"]: e for e in events(part, "step")}  # the resumed attempt's steps 5-8 follow the first's 1-4
    assert a.keys() == b.keys() == set(range(1, 9))
    assert len({a[s]["reward"] for s in a}) > 2  # the rewards move, so equal rewards mean equal samples
    assert a[8]["kl"] > 1e-4 and abs(a[8]["loss"]) > 1e-5  # the loss is not ~0: equal losses mean equal updates
    for s in a:
        for key in ("reward", "reward_std", "loss", "kl", "grad_norm", "no_signal_fraction"):
            assert b[s][key] == pytest.approx(a[s][key], abs=1e-6), (s, key)
    texts = lambda run: [(e["step"], e["text"], e["advantage"]) for e in events(run, "sample")]  # noqa: E731
    assert texts(part) == texts(full)


@pytest.mark.slow
def test_an_oom_while_sampling_says_so_and_the_ladder_shrinks_the_generation_batch(tmp_path):
    """Out of memory while sampling 32 completions from step 2 on, until the generation batch is 16 or less: the oom
    event says phase "sampling", so the ladder's first rung halves grpo.generation_batch_size (whole groups, the
    effective batch kept) and the run finishes. (With a floor of 8 it took 3 retries: generation 32 -> 16; micro-batch
    16 -> 8, as a generation batch stays a multiple of it; generation 16 -> 8 — the rung order tests/test_grpo_memory.py
    checks without training.)"""
    cfg = grpo_config(tmp_path, training={"max_steps": 3}, checkpoints={"every_steps": 1})
    proc, run = _run(tmp_path, "oom", cfg, env={"TRAINPILOT_INJECT_OOM": "2:16:sampling"})
    assert proc.returncode == 0, proc.stderr
    ooms = events(run, "oom")
    assert ooms and all(o["phase"] == "sampling" for o in ooms), ooms
    assert events(run, "retry")[0]["changes"] == {"grpo.generation_batch_size": 16}
    gens = [r["changes"]["grpo.generation_batch_size"] for r in events(run, "retry")
            if "grpo.generation_batch_size" in r["changes"]]
    assert gens == [16], gens
    assert events(run, "finished")[0]["step"] == 3
    assert all(s["micro_batch_size"] * s["gradient_accumulation_steps"] == 32 for s in events(run, "step"))


@pytest.mark.slow
def test_gspo_and_clip_higher_act_from_the_second_update_and_validation_scores_rewards(tmp_path):
    """GSPO (sequence-level ratios), DAPO's clip-higher and two optimizer steps per sampling pass reach TRL as set; the
    first step of each pass is on-policy (every ratio exactly 1: nothing clipped), the second is not (with a clip
    range this narrow, some completions hit it). Evaluation samples the validation prompts and scores them with the
    run's rewards: the eval events carry the reward and no policy-gradient loss."""
    cfg = grpo_config(tmp_path, training={"max_steps": 4, "eval_every_steps": 2}, data={"validation_split": 0.25},
                      grpo={"num_iterations": 2, "importance_sampling_level": "sequence", "loss_type": "grpo",
                            "epsilon": 1e-4, "epsilon_high": 2e-4}, checkpoints={"every_steps": 4})
    proc, run = _run(tmp_path, "gspo", cfg)
    assert proc.returncode == 0, proc.stderr
    started = events(run, "run_started")[0]
    assert (started["num_iterations"], started["importance_sampling_level"]) == (2, "sequence")
    assert started["clip_range"] == [1e-4, 2e-4]
    steps = {e["step"]: e for e in events(run, "step")}
    clipped = {s: e["ratio_clipped_low"] + e["ratio_clipped_high"] for s, e in steps.items()}
    assert clipped[1] == clipped[3] == 0 and clipped[2] + clipped[4] > 0, clipped
    evals = events(run, "eval")
    assert [e["step"] for e in evals] == [2, 4]
    for e in evals:
        assert isinstance(e["reward"], float) and set(e["rewards"]) == {"exact_answer"} and e.get("eval_loss") is None


@pytest.mark.slow
def test_lora_with_a_chat_template_and_kl_writes_the_adapter(tmp_path):
    """LoRA, beta > 0 (the reference = adapters off), a chat template: plain prompts become a user message after
    grpo.system_prompt, rendered with the generation prompt."""
    cfg = grpo_config(tmp_path, method="lora", chat=True, training={"max_steps": 2},
                      grpo={"beta": 0.04, "system_prompt": "last: never"}, checkpoints={"every_steps": 100})
    proc, run = _run(tmp_path, "lora", cfg)
    assert proc.returncode == 0, proc.stderr
    steps = events(run, "step")
    assert len(steps) == 2 and steps[0]["kl"] == 0.0 and steps[1]["kl"] > 0  # starts at the reference, moves off
    assert events(run, "run_started")[0]["reference_model"] == "adapters_disabled"
    sample = events(run, "sample")[0]
    assert sample["prompt"].startswith("system: last: never user: last: ") and sample["prompt"].endswith("assistant:")
    assert (run / "final" / "adapter_model.safetensors").is_file()
    assert events(run, "finished")[0]["wrapped_model"] == "PeftModelForCausalLM"


@pytest.mark.slow
def test_python_rewards_are_weighted_into_the_total_and_a_bad_one_stops_the_run_with_exit_2(tmp_path):
    """rewards.python beside exact_answer: step events carry each function's mean/std, samples carry the weighted
    total. A function that returns the wrong number of values only on real batches (preflight's dry run passes it)
    ends the worker with exit 2 and the reward module's one message."""
    (tmp_path / "mine.py").write_text(
        "WORDS = {'red', 'green', 'blue', 'black', 'white', 'gold', 'grey', 'brown'}\n\n"
        "def says_a_colour(prompts, completions, **kwargs):\n"
        "    return [1.0 if c.strip() in WORDS else 0.0 for c in completions]\n")
    cfg = grpo_config(tmp_path, training={"max_steps": 2}, checkpoints={"every_steps": 100},
                      rewards={"exact_answer": 1.0, "python": str(tmp_path / "mine.py"),
                               "python_weights": {"says_a_colour": 0.5}})
    proc, run = _run(tmp_path, "weighted", cfg)
    assert proc.returncode == 0, proc.stderr
    kept = run / "rewards" / "mine.py"  # the run scores with its own copy: editing mine.py later changes nothing
    assert kept.read_text() == (tmp_path / "mine.py").read_text()
    assert yaml.safe_load((run / "config.yaml").read_text())["rewards"]["python"] == str(kept.resolve())
    started = events(run, "run_started")[0]
    assert started["reward_functions"] == ["exact_answer", "says_a_colour"] and started["reward_weights"] == [1.0, 0.5]
    for s in events(run, "step"):
        per = s["rewards"]
        assert s["reward"] == pytest.approx(per["exact_answer"]["mean"] + 0.5 * per["says_a_colour"]["mean"])
    for e in events(run, "sample"):
        assert e["reward"] == pytest.approx(e["rewards"]["exact_answer"] + 0.5 * e["rewards"]["says_a_colour"])
    (tmp_path / "bad.py").write_text(
        "def short(prompts, completions, **kwargs):\n"
        "    return [0.0] * (len(completions) if len(completions) < 16 else 3)\n")
    cfg["rewards"] = {"python": str(tmp_path / "bad.py")}
    proc, run = _run(tmp_path, "bad", cfg)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "rewards.python: short" in proc.stderr and "returned 3 value(s) for 32 completions" in proc.stderr
    assert events(run, "failed")[-1]["exit_code"] == 2 and not events(run, "step")


@pytest.mark.slow  # a CLI child each (5-7 s)
@pytest.mark.parametrize("case", ["no_reference", "too_long", "messages_without_template", "vllm"])
def test_bad_grpo_inputs_exit_2_with_one_message(tmp_path, case):
    """The reference field and the prompts are checked in preflight (trainer.data.prompts and probes.grpocheck),
    vLLM's absence too (planning.requirements): nothing is written."""
    rows = last_word_records(8)
    sections: dict = {"training": {"max_steps": 2}}
    if case == "no_reference":
        rows[2] = {"prompt": rows[2]["prompt"]}
    elif case == "too_long":
        rows[5] = {"prompt": "last: " + " ".join(["red"] * 20), "answer": "red"}
    elif case == "messages_without_template":
        rows[0] = {"prompt": [{"role": "user", "content": "last: red blue"}], "answer": "blue"}
    else:
        sections["grpo"] = {"use_vllm": True}
    if case == "vllm" and importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    proc, run = _run(tmp_path, case, grpo_config(tmp_path, rows=rows, **sections))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    msg = proc.stderr
    assert not run.exists()  # refused before the run folder is made
    if case == "vllm":
        assert "grpo.use_vllm" in msg and "not installed" in msg
    elif case == "no_reference":
        assert "prompts.jsonl line 3" in msg and "'answer'" in msg and "rewards.answer_field" in msg
    elif case == "too_long":
        assert "prompts.jsonl line 6" in msg and "21 tokens" in msg and "leaves 15" in msg
        assert "data.skip_bad_lines" in msg
    else:
        assert "data.path" in msg and "no chat template" in msg


@pytest.mark.slow
def test_a_worker_started_by_hand_refuses_a_too_long_prompt_in_preflights_words(tmp_path):
    """The worker checks the prompt budget too (it is what skips prompts under data.skip_bad_lines): a config
    preflight never saw (the worker run by hand on a resolved config) gets the same refusal, naming the line."""
    import yaml

    rows = last_word_records(8)
    rows[5] = {"prompt": "last: " + " ".join(["red"] * 20), "answer": "red"}
    cfg = grpo_config(tmp_path, rows=rows, training={"max_steps": 1})
    ok, run = _run(tmp_path, "ok", dict(cfg, data=dict(cfg["data"], skip_bad_lines=True)))
    assert ok.returncode == 0, ok.stderr
    resolved = yaml.safe_load((run / "config.yaml").read_text())
    resolved["data"]["skip_bad_lines"] = False
    (run / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
    proc = subprocess.run([sys.executable, "-m", "trainer.worker", "--run-dir", str(run)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr
    failed = events(run, "failed")[-1]
    assert failed["exit_code"] == 2 and "prompts.jsonl line 6: the prompt is 21 tokens" in failed["message"]
    assert "leaves 15 for it" in failed["message"] and "data.skip_bad_lines: true" in failed["message"]


# -- in-process ----------------------------------------------------------------------------------------
def test_step_metrics_carry_grpo_fields_under_the_event_names():
    from trainer.worker.train.step_metrics import objective_fields

    logs = {"loss": 0.1, "reward": 0.75, "reward_std": 0.4, "frac_reward_zero_std": 0.25,
            "rewards/exact_answer/mean": 0.5, "rewards/exact_answer/std": 0.5, "rewards/format/mean": 1.0,
            "rewards/format/std": 0.0, "completions/mean_length": 12.5, "completions/clipped_ratio": 0.125,
            "kl": 0.01, "entropy": 1.5, "completions/max_length": 30.0, "rewards/bad/mean": float("nan")}
    out = objective_fields(logs).fields()
    assert out == {"reward": 0.75, "reward_std": 0.4, "no_signal_fraction": 0.25, "completion_length": 12.5,
                   "completion_clipped": 0.125, "kl": 0.01, "entropy": 1.5,
                   "rewards": {"exact_answer": {"mean": 0.5, "std": 0.5}, "format": {"mean": 1.0, "std": 0.0}}}
    dpo = objective_fields({"rewards/chosen": 1.0, "rewards/margins": 0.5}).fields()
    assert dpo == {"rewards_chosen": 1.0, "rewards_margin": 0.5}  # DPO's names are untouched
    evaluation = objective_fields({f"eval_{k}": v for k, v in logs.items()}, prefix="eval_").fields()
    assert evaluation == out  # GRPO's validation rewards: the same fields, read off the "eval_" keys


def test_every_objective_metric_is_a_typed_event_field():
    from trainer.rundir.records import OBJECTIVE_FIELDS
    from trainer.worker.train.step_metrics import OBJECTIVE_METRICS

    assert set(OBJECTIVE_METRICS.values()) | {"rewards"} == set(OBJECTIVE_FIELDS)


def test_no_signal_message_says_what_the_groups_scored():
    pytest.importorskip("trl")
    from trainer.worker.train.grpo import no_signal_message

    assert no_signal_message(5, 1.0, [0.0] * 5) == (
        "for 5 steps every answer in 100% of groups scored the same (every answer scores 0): no learning signal; "
        "check the reward (and rewards.answer_field) or start from an SFT model")
    assert "mean reward 1" in no_signal_message(5, 0.97, [1.0] * 5) and "97% of groups" in no_signal_message(
        5, 0.97, [1.0] * 5)
    solved = no_signal_message(5, 1.0, [1.5] * 5, top=1.5)  # every answer right: learned, not broken
    assert "the answers are right" in solved and "stop here" in solved and "SFT" not in solved
    assert "check it" in no_signal_message(5, 1.0, [0.5] * 5, top=1.5) and "grpo.temperature" in no_signal_message(
        5, 1.0, [0.5] * 5, top=1.5)


# The TRL methods TrainPilotGRPOTrainer overrides (and RepeatSampler's constructor it rebuilds), with their
# parameters in TRL 1.16.0: a TRL upgrade that changes one fails here, naming it.
TRL_RECORDED = {
    ("GRPOTrainer", "_get_train_sampler"): ("self", "dataset"),
    ("GRPOTrainer", "_generate"): ("self", "prompts"),
    ("GRPOTrainer", "_prepare_inputs"): ("self", "generation_batch"),
    ("GRPOTrainer", "training_step"): ("self", "model", "inputs", "num_items_in_batch"),
    ("GRPOTrainer", "_generate_and_score_completions"): ("self", "inputs"),
    ("RepeatSampler", "__init__"): ("self", "data_source", "mini_repeat_count", "batch_size", "repeat_count",
                                    "shuffle", "seed"),
}


@pytest.mark.parametrize("cls,method", list(TRL_RECORDED))
def test_trl_methods_we_override_keep_their_parameters(cls, method):
    root = Path(importlib.util.find_spec("trl").submodule_search_locations[0]) / "trainer"
    source = root / ("grpo_trainer.py" if cls == "GRPOTrainer" else "utils.py")
    tree = ast.parse(source.read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    fn = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == method), None)
    assert fn is not None, f"trl's {cls}.{method} is gone: adapt trainer/worker/train/grpo.py"
    params = tuple(a.arg for a in fn.args.args)
    assert params == TRL_RECORDED[(cls, method)], f"trl's {cls}.{method} now takes {params}: adapt grpo.py"


def test_grpo_trainer_takes_the_mixins_overrides():
    """TrainPilotMixin (hf_glue) overrides Trainer methods and calls TRL's positionally: GRPOTrainer's must take
    the recorded parameters in the same order (its _get_train_sampler names its one ``dataset``)."""
    from test_trainer_contract import RECORDED
    from trl import GRPOTrainer

    for method, recorded in RECORDED.items():
        if recorded is not None:
            params = list(inspect.signature(getattr(GRPOTrainer, method)).parameters)
            assert len(params) == len(recorded), f"GRPOTrainer.{method}{tuple(params)}: adapt hf_glue.py"


def test_grpo_module_overrides_only_recorded_trl_methods():
    """New overrides of TRL's GRPOTrainer in grpo.py must be recorded above (or carry the _tp_ prefix)."""
    tree = ast.parse((Path(__file__).resolve().parents[1] / "trainer/worker/train/grpo.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TrainPilotGRPOTrainer")
    names = {f.name for f in cls.body if isinstance(f, ast.FunctionDef) and not f.name.startswith("_tp_")}
    assert names == {m for c, m in TRL_RECORDED if c == "GRPOTrainer"}, names
