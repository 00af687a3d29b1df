"""Watching it learn: eval events with perplexity, sample answers at each evaluation, early stopping
that ends the run and makes final/ the best checkpoint (real worker in a child process)."""
from __future__ import annotations

import math

import pytest
from helpers_train import cli, events, tiny_config, write_config

from trainer import config as config_mod


@pytest.mark.slow
def test_samples_at_each_eval_and_early_stopping_keeps_the_best_checkpoint(tmp_path):
    # min_delta 10 makes every evaluation after the first "not better": patience 2 stops at step 3.
    cfg = tiny_config(name="es", data={"validation_split": 0.02},
                      training={"max_steps": 10, "eval_every_steps": 1},
                      checkpoints={"every_steps": 1, "keep_last": 1},
                      output={"tensorboard": False, "runs_dir": str(tmp_path / "runs"), "run_name": "es"},
                      evaluation={"sample_prompts": ["Once upon", "The cat"], "max_new_tokens": 5,
                                  "early_stopping_patience": 2, "early_stopping_min_delta": 10.0})
    proc = cli("run", write_config(tmp_path / "es.yaml", cfg), "--quiet")
    assert proc.returncode == 0, proc.stderr
    run = tmp_path / "runs" / "es"
    evals = events(run, "eval")
    assert [e["step"] for e in evals] == [1, 2, 3]
    assert all(math.isclose(e["perplexity"], math.exp(e["eval_loss"]), rel_tol=1e-9) for e in evals)
    samples = events(run, "sample")
    assert [(s["step"], s["prompt"]) for s in samples] == [(st, p) for st in (1, 2, 3) for p in ("Once upon", "The cat")]
    assert all(isinstance(s["text"], str) and s["tokens"] <= 5 for s in samples)
    (stopped,) = events(run, "early_stopped")
    assert (stopped["step"], stopped["best_step"], stopped["metric"]) == (3, 1, "eval_loss")
    assert events(run, "finished")[0]["step"] == 3
    # keep_last 1 would have deleted checkpoint-1; the best checkpoint is kept
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint-1", "checkpoint-3"]
    from safetensors.torch import load_file

    final = load_file(str(run / "final" / "model.safetensors"))
    best = load_file(str(run / "checkpoints" / "checkpoint-1" / "model.safetensors"))
    last = load_file(str(run / "checkpoints" / "checkpoint-3" / "model.safetensors"))
    assert all((final[k] == best[k]).all() for k in best)
    assert any(not (final[k] == last[k]).all() for k in last)


def test_config_checks_for_samples_and_early_stopping():
    with pytest.raises(config_mod.ConfigError, match="evaluation.sample_every_steps"):
        config_mod.validate({"evaluation": {"sample_prompts": ["hi"]}})
    with pytest.raises(config_mod.ConfigError, match="training.eval_every_steps"):
        config_mod.validate({"evaluation": {"early_stopping_patience": 2}})
    with pytest.raises(config_mod.ConfigError, match="never the URL itself"):
        config_mod.validate({"notify": {"webhook_url_env": "https://discord.com/api/webhooks/1/abc"}})
    ok = config_mod.validate({"evaluation": {"sample_prompts": ["hi"], "sample_every_steps": 5},
                              "output": {"report_to": ["mlflow"]}})
    assert ok.evaluation.sample_every_steps == 5 and ok.output.report_to == ["mlflow"]


@pytest.mark.slow
def test_early_stopping_counts_on_across_a_stop_and_resume(tmp_path):
    cfg = tiny_config(name="esr", data={"validation_split": 0.02},
                      training={"max_steps": 10, "eval_every_steps": 1},
                      checkpoints={"every_steps": 1, "keep_last": 3},
                      output={"tensorboard": False, "runs_dir": str(tmp_path / "runs"), "run_name": "esr"},
                      evaluation={"early_stopping_patience": 2, "early_stopping_min_delta": 10.0})
    proc = cli("run", write_config(tmp_path / "esr.yaml", cfg), "--quiet", env={"TRAINPILOT_INJECT_STOP": "2"})
    run = tmp_path / "runs" / "esr"
    assert proc.returncode == 0 and events(run, "stopped"), proc.stderr
    proc = cli("resume", run, "--quiet")
    assert proc.returncode == 0, proc.stderr
    # evals 1 (best) and 2 (not better) happened before the stop: the resumed attempt stops at 3
    (stopped,) = events(run, "early_stopped")
    assert (stopped["step"], stopped["best_step"]) == (3, 1)
