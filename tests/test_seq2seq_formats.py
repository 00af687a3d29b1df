"""Every detected record format trains on every objective it can mean: Alpaca, prompt/completion and chat
records train an encoder-decoder (T5) from their own fields (templates still override), prompt/completion
records train a causal model with the prompt masked, and a format without an input/target pair is refused
once, in preflight, with the fix."""
from __future__ import annotations

import pytest

from helpers_pref import pairs, t5_config
from helpers_train import cli, events, run_cli, tiny_config, write_config, write_jsonl
from trainer import config as config_mod
from trainer.data import formats
from trainer.supervisor import preflight

SYSTEM = {"role": "system", "content": "Answer briefly."}


def _alpaca(n: int = 64) -> list[dict]:
    return [{"instruction": p["prompt"], "input": "", "output": p["chosen"].strip()} for p in pairs(n)]


def _chat(n: int = 64) -> list[dict]:
    return [{"messages": [SYSTEM, {"role": "user", "content": p["prompt"]},
                          {"role": "assistant", "content": p["chosen"].strip()}]} for p in pairs(n)]


def _prompt_completion(n: int = 64) -> list[dict]:
    return [{"prompt": p["prompt"], "completion": p["chosen"]} for p in pairs(n)]


def test_each_format_gives_an_input_and_a_target():
    alpaca = {"instruction": "Translate", "input": "Haus", "output": "house", "system": "Be exact."}
    assert formats.to_input_target(alpaca, "alpaca") == ("Be exact.\n\nTranslate\n\nHaus", "house")
    assert formats.to_input_target({"prompt": "2+2?", "completion": "4"}, "prompt_completion") == ("2+2?", "4")
    chat = _chat(1)[0]
    assert formats.to_input_target(chat, "chat") == (f"Answer briefly.\n\n{pairs(1)[0]['prompt']}",
                                                    pairs(1)[0]["chosen"].strip())
    turns = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"},
                               {"from": "human", "value": "colour?"}, {"from": "gpt", "value": "red"}]}
    assert formats.to_input_target(turns, "sharegpt") == ("user: hi\nassistant: hello\nuser: colour?", "red")


def test_prompt_completion_is_detected_apart_from_kto_and_checked():
    assert formats.record_format_of([{"prompt": "a", "completion": "b"}]) == "prompt_completion"
    assert formats.record_format_of([{"prompt": "a", "completion": "b", "label": True}]) == "kto"
    assert formats.check_record({"prompt": "a", "completion": 3}, "prompt_completion")[0] == "completion"
    assert "prompt_completion" in formats.TRAINABLE_FORMATS and formats.seq2seq_problem("prompt_completion") is None
    assert "data.prompt_template" in formats.seq2seq_problem("text")


@pytest.mark.parametrize("rows", [_alpaca(8), _chat(8), _prompt_completion(8)], ids=["alpaca", "chat", "prompt"])
def test_preflight_lets_t5_train_on_fields_without_templates(tmp_path, rows):
    cfg = t5_config(tmp_path)
    cfg["data"].pop("prompt_template"), cfg["data"].pop("response_template")
    cfg["data"]["path"] = str(write_jsonl(tmp_path / "d.jsonl", rows))
    preflight.check(config_mod.validate(cfg))


def test_t5_on_plain_text_is_refused_once_with_the_fix(tmp_path):
    cfg = t5_config(tmp_path)
    cfg["data"].pop("prompt_template"), cfg["data"].pop("response_template")
    cfg["data"]["path"] = str(write_jsonl(tmp_path / "t.jsonl", [{"text": "just text"}] * 4))
    proc = run_cli(["run", str(write_config(tmp_path / "c.yaml", cfg)), "--run-dir", str(tmp_path / "run")],
                   cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("encoder-decoder model (T5) reads an input and a target") == 1
    assert "data.prompt_template" in proc.stderr and "alpaca, prompt/completion, chat" in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # trains the tiny T5 and the tiny Llama in child processes
@pytest.mark.parametrize("kind", ["t5-alpaca", "t5-chat", "causal-prompt"])
def test_fields_train_without_templates(tmp_path, kind):
    if kind.startswith("t5"):
        cfg = t5_config(tmp_path)
        cfg["data"].pop("prompt_template"), cfg["data"].pop("response_template")
        rows = _alpaca() if kind == "t5-alpaca" else _chat()
    else:
        cfg = tiny_config(data={"seq_len": 64, "packing": False}, training={"max_steps": 12, "learning_rate": 5e-3})
        rows = _prompt_completion()
    cfg["data"]["path"] = str(write_jsonl(tmp_path / "d.jsonl", rows))
    run = tmp_path / "run"
    proc = cli("run", write_config(tmp_path / "c.yaml", cfg), "--run-dir", run, "--quiet")
    assert proc.returncode == 0, proc.stderr
    started, steps = events(run, "run_started")[0], events(run, "step")
    assert started["record_format"] == {"t5-alpaca": "alpaca", "t5-chat": "chat"}.get(kind, "prompt_completion")
    if kind.startswith("t5"):
        assert started["encoder_decoder"] is True and (run / "final" / "model.safetensors").is_file()
    assert len(steps) == 12 and steps[-1]["loss"] < 0.8 * steps[0]["loss"]
