"""Each trainable record format trains through ``trainpilot-cli run``; the token cache is reused by a
second run; a tokenizer trained on the corpus lands in the run and final/; a streaming run that is
stopped and resumed reproduces the uninterrupted run's losses (CPU, fp32, 1e-6)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers_train import cli, events, losses, tiny_config, write_config, write_jsonl
from test_data_formats import SAMPLES

pytestmark = pytest.mark.slow


def run_format(tmp_path: Path, fmt: str, **data) -> Path:
    path = write_jsonl(tmp_path / f"{fmt}.jsonl", SAMPLES[fmt], repeat=20)
    extra = {"prompt_template": "Q: {question}\nA: ", "response_template": "{answer}"} if fmt == "template" else {}
    cfg = write_config(tmp_path / f"{fmt}.yaml", tiny_config(data={"path": str(path), "seq_len": 48, **extra, **data},
                                                             training={"max_steps": 2}))
    run = tmp_path / f"run-{fmt}"
    proc = cli("run", cfg, "--run-dir", run, "--quiet", env={"TRAINPILOT_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr
    return run


@pytest.mark.parametrize("fmt", ["template", "alpaca", "chat", "sharegpt", "prompt_response"])
def test_each_trainable_format_trains(tmp_path, fmt):
    run = run_format(tmp_path, fmt)
    started = events(run, "run_started")[-1]
    assert started["record_format"] == fmt and started["records"] == 20 * len(SAMPLES[fmt])
    assert len(losses(run)) == 2 and all(v > 0 for v in losses(run).values())
    if fmt in ("alpaca", "chat", "sharegpt", "prompt_response"):  # the template rendered in training ships with it
        saved = (run / "final" / "chat_template.jinja")
        config = json.loads((run / "final" / "tokenizer_config.json").read_text())
        template = saved.read_text() if saved.exists() else config.get("chat_template")
        from trainer.data.conversations import DEFAULT_CHAT_TEMPLATE

        assert template == DEFAULT_CHAT_TEMPLATE


def test_text_with_a_corpus_tokenizer_and_the_cache_reused(tmp_path):
    run = run_format(tmp_path, "text", packing=True)
    assert events(run, "run_started")[-1]["data_cache"] == "miss"
    second = tmp_path / "second"
    cfg = tmp_path / "text.yaml"
    assert cli("run", cfg, "--run-dir", second, "--quiet", env={"TRAINPILOT_CACHE": str(tmp_path / "cache")}).returncode == 0
    assert events(second, "run_started")[-1]["data_cache"] == "hit"
    assert losses(second) == losses(run), "the cached data trains identically"

    import yaml

    data = yaml.safe_load(cfg.read_text())
    data["model"]["tokenizer"], data["model"]["tokenizer_vocab_size"] = "corpus", 320
    cfg.write_text(yaml.safe_dump(data))
    corpus = tmp_path / "corpus"
    proc = cli("run", cfg, "--run-dir", corpus, "--quiet", env={"TRAINPILOT_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr
    from transformers import PreTrainedTokenizerFast

    sizes = {len(PreTrainedTokenizerFast.from_pretrained(str(where))) for where in (corpus / "tokenizer", corpus / "final")}
    assert len(sizes) == 1 and 259 <= sizes.pop() <= 320, "256 bytes + 3 specials + merges, at most the size asked for"
    assert list((tmp_path / "cache" / "tokenizers").glob("corpus-320-*")), "cached for the next run"


def test_streaming_resume_reproduces_the_uninterrupted_losses(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", tiny_config(data={"streaming": True}, training={"max_steps": 6},
                                                        checkpoints={"every_steps": 5}))
    full, part = tmp_path / "full", tmp_path / "part"
    assert cli("run", cfg, "--run-dir", full, "--quiet").returncode == 0
    proc = cli("run", cfg, "--run-dir", part, "--quiet", env={"TRAINPILOT_INJECT_STOP": "3"})
    assert proc.returncode == 0, proc.stderr
    assert events(part, "stopped")[-1]["step"] == 3
    proc = cli("resume", part, "--quiet")
    assert proc.returncode == 0, proc.stderr
    a, b = losses(full), losses(part)
    assert list(a) == [1, 2, 3, 4, 5, 6] and a.keys() == b.keys()
    for step in a:
        assert b[step] == pytest.approx(a[step], abs=1e-6), step
    assert events(full, "run_started")[-1]["train_samples"] is None, "a stream has no length"


def test_hub_dataset_from_a_local_folder_trains(tmp_path):
    """A local dataset folder stands in for a hub id: the preflight opens it in a worker-room child,
    the worker loads it through ``datasets`` and trains (no network: HF_HUB_OFFLINE)."""
    folder = tmp_path / "hub-dataset"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", SAMPLES["sharegpt"], repeat=20)
    cfg = write_config(tmp_path / "c.yaml", tiny_config(data={"hub_dataset": str(folder), "hub_split": "train",
                                                              "seq_len": 48}, training={"max_steps": 2}))
    run = tmp_path / "run"
    env = {"TRAINPILOT_CACHE": str(tmp_path / "cache"), "HF_DATASETS_CACHE": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    proc = cli("run", cfg, "--run-dir", run, "--quiet", env=env)
    assert proc.returncode == 0, proc.stderr
    started = events(run, "run_started")[-1]
    assert (started["record_format"], started["records"]) == ("sharegpt", 20) and len(losses(run)) == 2
