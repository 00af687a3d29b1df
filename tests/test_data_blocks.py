"""Training data tokenized while the model trains (``trainer.worker.datapipe.producer`` / ``blocks``).

The training order is fixed before anything is tokenized (seeded record order, chunks, packing), so a
run on an empty cache, on a half-written one and on a complete one trains on the same blocks, and a
run stopped while the tokenizing process is still working resumes exactly. A record the tokenizing
process cannot render fails the run with its line (exit 2); a role the chat template refuses is
found before the first step.
"""
from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import pytest
from helpers_train import cli, events, losses, tiny_config, write_config

from trainer.core.errors import UserError
from trainer.worker.datapipe import blocks
from trainer.worker.datapipe import producer

WORDS = "the a cat dog river bridge garden station builds finds paints quiet bright wooden long green".split()


def big_text_file(path: Path, records: int = 24_000, seed: int = 0) -> Path:
    """A JSONL file over ``pipeline.SMALL_FILE_BYTES`` (so a separate tokenizing process does the work)."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as fh:
        for _ in range(records):
            fh.write(json.dumps({"text": " ".join(rng.choices(WORDS, k=rng.randint(40, 90)))}) + "\n")
    from trainer.worker.datapipe.pipeline import SMALL_FILE_BYTES

    assert path.stat().st_size > SMALL_FILE_BYTES and records > 2 * producer.CHUNK_RECORDS
    return path


# -- pieces --------------------------------------------------------------------------------------------------
def test_jsonl_lines_finds_the_records_the_scan_counts(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_bytes(b'\xef\xbb\xbf{"text": "one"}\n\n   \n{"text": "two"}\r\n{broken\n{"text": "three"}')
    lines = producer.JsonlLines(f, skipped_lines=[5])
    assert len(lines) == 3
    got = [json.loads(s) for s in lines.batch([2, 0, 1])["__record_json"]]
    assert got == [{"text": "three"}, {"text": "one"}, {"text": "two"}]


def test_parts_are_seeded_and_the_split_holds_out_the_tail():
    a = producer.parts_of(100, seed=7, shuffle=True, validation_split=0.1)
    b = producer.parts_of(100, seed=7, shuffle=True, validation_split=0.1)
    c = producer.parts_of(100, seed=8, shuffle=True, validation_split=0.1)
    assert list(a) == ["eval", "train"] and len(a["eval"]) == 10 and len(a["train"]) == 90
    assert sorted([*a["eval"], *a["train"]]) == list(range(100))
    assert (a["train"] == b["train"]).all() and not (a["train"] == c["train"]).all()
    assert list(producer.parts_of(5, 7, False, 0.0)["train"]) == [0, 1, 2, 3, 4]
    with pytest.raises(UserError, match="data.validation_split"):
        producer.split_counts(1, 0.5)


def _write_chunk(folder: Path, k: int, first: int, n: int) -> None:
    import pyarrow as pa

    rows = [[first + i] * 3 for i in range(n)]
    producer.write_table(pa.table({"input_ids": pa.array(rows, pa.list_(pa.int32())),
                                   "labels": pa.array(rows, pa.list_(pa.int32()))}),
                         producer.chunk_file(folder, "train", k))


@pytest.mark.slow  # a child process or a model load: seconds (pytest -m 'not slow' stays under 4 min)
def test_blocks_wait_for_the_producer_and_the_order_covers_every_block(tmp_path):
    _write_chunk(tmp_path, 0, 0, 4)
    b = blocks.Blocks(tmp_path, "train")

    def later():
        time.sleep(0.3)
        _write_chunk(tmp_path, 1, 4, 3)
        (tmp_path / "train.done").write_text(json.dumps({"chunks": 2, "blocks": [4, 3]}))

    threading.Thread(target=later).start()
    t = time.time()
    assert b[5]["input_ids"] == [5, 5, 5] and time.time() - t >= 0.25, "block 5 is in the chunk written later"
    assert b.wait_for(6) and not b.wait_for(7), "the part is complete with 7 blocks"
    with pytest.raises(TypeError):
        len(b)  # unknown length unless sized: HF then trains by max_steps
    order = iter(blocks.BlockOrder(b, seed=3, shuffle=True))
    first, second = [next(order) for _ in range(7)], [next(order) for _ in range(7)]
    assert first == list(range(7)), "epoch 0: as tokenized (the records were shuffled before packing)"
    assert sorted(second) == list(range(7)) and second != first, "epoch 1: a seeded permutation of all blocks"
    again = iter(blocks.BlockOrder(b, seed=3, shuffle=True))
    assert [next(again) for _ in range(14)] == first + second
    sized = blocks.Blocks(tmp_path, "train", sized=True)
    o = blocks.BlockOrder(sized, seed=3, shuffle=True)
    o.set_epoch(1)
    assert len(sized) == len(o) == 7 and list(o) == second


def test_a_producer_error_is_raised_where_the_block_is_awaited(tmp_path):
    (tmp_path / producer.ERROR_FILE).write_text(json.dumps(
        {"message": "data.path: d.jsonl line 9, field 'messages': refused", "field": "data.path", "path": "d.jsonl",
         "exit_code": 2}))
    with pytest.raises(UserError, match="line 9"):
        blocks.Blocks(tmp_path, "train")[0]


# -- through the CLI --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_same_blocks_from_any_cache_and_a_run_stopped_while_tokenizing_resumes_exactly(tmp_path):
    """One uninterrupted run on an empty cache is the reference. A run stopped at step 3 while its
    tokenizing process is still working (a second, empty cache) and resumed on the half-written cache
    gives the same losses; so do a run on the complete cache and the first step of an epochs run."""
    data = big_text_file(tmp_path / "big.jsonl")
    cfg = write_config(tmp_path / "c.yaml", tiny_config(data={"path": str(data), "seq_len": 64},
                                                        training={"max_steps": 6}, checkpoints={"every_steps": 5}))
    first = {"TRAINPILOT_CACHE": str(tmp_path / "cache1")}
    cold = tmp_path / "cold"
    assert cli("run", cfg, "--run-dir", cold, "--quiet", env=first).returncode == 0
    started = events(cold, "run_started")[-1]
    assert started["data_cache"] == "miss" and started["train_samples"] is None, "not known before tokenizing ends"
    reference = losses(cold)
    assert list(reference) == [1, 2, 3, 4, 5, 6]

    second, part = {"TRAINPILOT_CACHE": str(tmp_path / "cache2")}, tmp_path / "part"
    proc = cli("run", cfg, "--run-dir", part, "--quiet", env=dict(second, TRAINPILOT_INJECT_STOP="3"))
    assert proc.returncode == 0, proc.stderr
    assert events(part, "stopped")[-1]["step"] == 3
    proc = cli("resume", part, "--quiet", env=second)
    assert proc.returncode == 0, proc.stderr
    assert events(part, "run_started")[-1]["data_cache"] in ("partial", "hit")
    assert losses(part) == pytest.approx(reference, abs=1e-6)

    epochs = write_config(tmp_path / "e.yaml", tiny_config(data={"path": str(data), "seq_len": 64},
                                                           training={"max_steps": None, "epochs": 1}))
    proc = cli("run", epochs, "--run-dir", tmp_path / "epochs", "--quiet", env=dict(first, TRAINPILOT_INJECT_STOP="1"))
    assert proc.returncode == 0, proc.stderr
    assert events(tmp_path / "epochs", "run_started")[-1]["train_samples"] > 1000, "epochs: tokenized whole first"
    assert losses(tmp_path / "epochs")[1] == pytest.approx(reference[1], abs=1e-6)
    complete = tmp_path / "complete"
    assert cli("run", cfg, "--run-dir", complete, "--quiet", env=first).returncode == 0
    assert events(complete, "run_started")[-1]["data_cache"] == "hit"
    assert losses(complete) == pytest.approx(reference, abs=1e-6)
    assert not list((tmp_path / "cache1" / "blocks").glob("*/spec-*.json")), "the producers' spec files are removed"


def chat_records(n: int, bad_at: int | None = None, role_at: int | None = None) -> list[dict]:
    rows = []
    for i in range(n):
        answer = "BOOM" if i == bad_at else " ".join(random.Random(i).choices(WORDS, k=300))
        turns = [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": answer}]
        if i == role_at:
            turns.insert(1, {"role": "tool", "content": "42"})
        rows.append({"messages": turns})
    return rows


REFUSING_TEMPLATE = (
    "{%- for m in messages %}"
    "{%- if m['role'] not in ['user', 'assistant'] %}{{ raise_exception('Unknown role: ' + m['role']) }}{% endif %}"
    "{%- if m['content'] == 'BOOM' %}{{ raise_exception('content the template cannot render') }}{% endif %}"
    "{{ '<|' + m['role'] + '|>' + m['content'] + eos_token }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


@pytest.mark.slow
def test_a_role_the_template_refuses_is_bad_input_before_the_first_step(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in chat_records(40, role_at=6)))
    cfg = write_config(tmp_path / "c.yaml", tiny_config(data={"path": str(path), "seq_len": 64,
                                                              "chat_template": REFUSING_TEMPLATE}))
    proc = cli("run", cfg, "--run-dir", tmp_path / "run", "--quiet")
    assert proc.returncode == 2, proc.stderr
    assert "line 7" in proc.stderr and "Unknown role: tool" in proc.stderr and "Traceback" not in proc.stderr
    assert not events(tmp_path / "run", "step")


@pytest.mark.slow
def test_a_record_the_tokenizing_process_cannot_render_fails_the_run_with_its_line(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in chat_records(5000, bad_at=4321)))
    from trainer.worker.datapipe.pipeline import SMALL_FILE_BYTES

    assert path.stat().st_size > SMALL_FILE_BYTES
    cfg = write_config(tmp_path / "c.yaml", tiny_config(data={"path": str(path), "seq_len": 64,
                                                              "chat_template": REFUSING_TEMPLATE},
                                                        training={"max_steps": None, "epochs": 1}))
    proc = cli("run", cfg, "--run-dir", tmp_path / "run", "--quiet", env={"TRAINPILOT_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 2, proc.stderr
    assert "line 4322" in proc.stderr and "cannot render" in proc.stderr and "Traceback" not in proc.stderr
    assert not events(tmp_path / "run", "step")


@pytest.mark.slow  # a child process or a model load: seconds (pytest -m 'not slow' stays under 4 min)
def test_a_run_without_deepspeed_does_not_import_it():
    """accelerate's unwrap path would import deepspeed (2-3 s of every start) when it is installed."""
    import subprocess
    import sys

    code = ("import sys, torch\nfrom trainer.worker.train.recipe import _no_deepspeed_import\n_no_deepspeed_import()\n"
            "from accelerate.utils import extract_model_from_parallel\n"
            "extract_model_from_parallel(torch.nn.Linear(2, 2))\nprint('deepspeed' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.slow
def test_the_data_report_tokenizes_into_the_cache_the_run_starts_on(tmp_path):
    path = tmp_path / "d.jsonl"
    rng = random.Random(3)
    path.write_text("".join(json.dumps({"text": " ".join(rng.choices(WORDS, k=rng.randint(5, 30)))}) + "\n"
                            for _ in range(300)))
    cfg = write_config(tmp_path / "c.yaml", tiny_config(data={"path": str(path), "seq_len": 64},
                                                        training={"max_steps": 2}))
    env = {"TRAINPILOT_CACHE": str(tmp_path / "cache")}
    proc = cli("data", cfg, "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["records"] == 300 and sum(report["histogram"]["counts"]) == 300
    assert report["tokens"]["trained"] == report["tokens"]["total"], "plain text: every token is trained"
    assert cli("run", cfg, "--run-dir", tmp_path / "run", "--quiet", env=env).returncode == 0
    assert events(tmp_path / "run", "run_started")[-1]["data_cache"] == "hit"
