"""End to end on the real families (tests/real_models.py): ``trainpilot-cli run`` trains a tiny model of
each family, with its real tokenizer and chat template, on chat data that has a system prompt."""
from __future__ import annotations

import json

import pytest

import real_models as rm
from helpers_train import cli, events, tiny_config, write_config

RECORDS = [{"messages": [{"role": "system", "content": "You are terse."},
                         {"role": "user", "content": f"What is {i}+{i}?"},
                         {"role": "assistant", "content": f"{2 * i}."},
                         {"role": "user", "content": "Thanks!"},
                         {"role": "assistant", "content": "You are welcome."}]} for i in range(12)]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(rm.FAMILIES))
def test_cli_run_trains_every_family_on_chat_data_with_a_system_prompt(tmp_path, name):
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS), encoding="utf-8")
    cfg = tiny_config(model={"source": str(rm.family_dir(name))},
                      data={"path": str(data), "seq_len": 256, "packing": True},
                      training={"max_steps": 2, "effective_batch_size": 2, "micro_batch_size": 2,
                                "gradient_accumulation_steps": 1},
                      checkpoints={"every_steps": 100, "keep_last": 1})
    run_dir = tmp_path / "run"
    env = {"TRAINPILOT_CACHE": str(tmp_path / "cache"), "HF_DATASETS_CACHE": str(tmp_path / "hf-datasets")}
    proc = cli("run", write_config(tmp_path / "config.yaml", cfg), "--run-dir", run_dir, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = events(run_dir, "step")
    assert [e["step"] for e in steps] == [1, 2] and all(e["loss"] > 0 for e in steps)
    final = run_dir / "final"
    saved = json.loads((final / "tokenizer_config.json").read_text(encoding="utf-8"))
    template = saved.get("chat_template") or (final / "chat_template.jinja").read_text(encoding="utf-8")
    assert template == rm.template_text(name), "the model ships with the template it was trained with"
