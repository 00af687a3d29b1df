"""``trainpilot-cli chat``: answers from final/ and from a LoRA checkpoint, the training rendering,
greedy decoding of merged vs base+adapter, streaming, stdin, refusals (real CLI, real runs)."""
from __future__ import annotations

import json
import os

import pytest

from trainer.supervisor import runlock
from helpers_train import PROMPT_TEMPLATE, cli, trained_runs


@pytest.fixture(scope="module")
def runs():
    return trained_runs()


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_prompt_on_a_full_runs_final_answers_in_json(runs):
    proc = cli("chat", runs["full"], "--prompt", "Once upon a time", "--json", "--temperature", "0",
               "--max-new-tokens", "12")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["checkpoint"] == "final" and out["base"] is False
    assert out["text"].strip() and 0 < out["tokens"] <= 12
    assert out["rendered_prompt"] == "<s>Once upon a time"  # plain-text run: BOS + the text, as trained


@pytest.mark.slow
def test_prompt_on_a_lora_checkpoint_uses_the_training_template(runs):
    proc = cli("chat", runs["lora"], "--checkpoint", "1", "--prompt", "What is 3 plus 4?", "--json",
               "--temperature", "0", "--max-new-tokens", "8")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["checkpoint"] == "checkpoint-1" and out["tokens"] > 0 and out["text"]
    assert out["rendered_prompt"] == "<s>" + PROMPT_TEMPLATE.format(question="What is 3 plus 4?")


@pytest.mark.slow
def test_rendered_ids_equal_the_training_tokenization(runs):
    from trainer import config as config_mod
    from trainer.worker.generate import generation as chat
    from trainer.worker.datapipe.rendering import Encoder
    from trainer.worker.loading import modeling

    cfg = config_mod.load(runs["lora"] / "config.yaml")
    tok = modeling.load_tokenizer(cfg, runs["lora"] / "final")
    record = {"question": ["What is 5 plus 2?"], "answer": ["5 plus 2 is 7."]}
    trained = Encoder(cfg, tok, "template", "test records")(record, [0])  # how the worker tokenizes template records
    ids, labels = trained["input_ids"][0], trained["labels"][0]
    prompt_len = next(i for i, x in enumerate(labels) if x != -100)  # prompt tokens are masked from the loss
    assert chat.prompt_ids(cfg, tok, "What is 5 plus 2?") == ids[:prompt_len]


@pytest.mark.slow
def test_greedy_merged_and_base_plus_adapter_give_the_same_tokens(runs):
    from trainer import config as config_mod
    from trainer.worker.generate import generation as chat
    from trainer.worker.export import model_export as export_model
    from trainer.worker.loading import modeling

    cfg = config_mod.load(runs["lora"] / "config.yaml")
    source = runs["lora"] / "final"
    tok = modeling.load_tokenizer(cfg, source)
    ids = chat.prompt_ids(cfg, tok, "What is 6 plus 1?")
    greedy = dict(max_new_tokens=16, temperature=0.0, top_p=1.0)
    peft_out = chat.generate(chat.load_model(cfg, source), tok, ids, **greedy)
    merged_out = chat.generate(export_model.merged_model(cfg, source), tok, ids, **greedy)
    base_out = chat.generate(chat.load_model(cfg, source, base=True), tok, ids, **greedy)
    assert peft_out["token_ids"] == merged_out["token_ids"] and peft_out["tokens"] > 0
    assert base_out["token_ids"] != peft_out["token_ids"], "the adapter must change the answer for this check to mean anything"


@pytest.mark.slow
def test_stream_json_sends_tokens_then_the_whole_answer(runs):
    proc = cli("chat", runs["full"], "--prompt", "The", "--stream-json", "--seed", "3", "--max-new-tokens", "10")
    assert proc.returncode == 0, proc.stderr
    lines = _json_lines(proc.stdout)
    kinds = [x["type"] for x in lines]
    assert kinds[0] == "loaded" and kinds[-1] == "done" and kinds.count("token") >= 1
    assert "".join(x["text"] for x in lines if x["type"] == "token") == lines[-1]["text"]


@pytest.mark.slow
def test_interactive_mode_answers_each_stdin_line_and_base_is_selectable(runs):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "trainer", "chat", str(runs["lora"]), "--base", "--json",
                           "--temperature", "0", "--max-new-tokens", "4"],
                          input="What is 2 plus 2?\n\nWhat is 9 plus 1?\n", capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    answers = _json_lines(proc.stdout)
    assert len(answers) == 2 and all(a["base"] for a in answers)
    assert "9 plus 1" in answers[1]["rendered_prompt"]


@pytest.mark.slow
def test_refuses_while_the_run_is_training_and_names_unknown_checkpoints(runs, tmp_path):
    import shutil

    run = tmp_path / "busy"
    shutil.copytree(runs["full"], run)
    (run / "status.json").write_text(json.dumps({"state": "running", "pid": os.getpid()}))
    runlock.hold(run)  # a live supervisor holds its folder's lock: this process stands in for it
    proc = cli("chat", run, "--prompt", "hi")
    assert proc.returncode == 2 and "still training" in proc.stderr and "Traceback" not in proc.stderr
    runlock.release(run)
    (run / "status.json").write_text(json.dumps({"state": "finished", "pid": os.getpid()}))
    proc = cli("chat", run, "--checkpoint", "7", "--prompt", "hi")
    assert proc.returncode == 2 and "complete checkpoints: 1, 2" in proc.stderr, proc.stderr


def test_a_tokenizer_with_a_chat_template_renders_with_it_and_stops_at_its_end_token():
    from trainer import config as config_mod
    from trainer.data.readers import bundled_demo_path
    from trainer.worker.generate import generation as chat
    from trainer.worker.datapipe.tokenizer import demo_tokenizer

    tok = demo_tokenizer(bundled_demo_path())
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    cfg = config_mod.validate({"data": {"prompt_template": "Q: {q}\n", "response_template": "{a}"}})
    ids = chat.prompt_ids(cfg, tok, "hello there")  # the template wins over the run's prompt_template
    assert tok.decode(ids) == "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"
    assert tok.convert_tokens_to_ids("<|im_end|>") in chat.stop_ids(tok) and tok.eos_token_id in chat.stop_ids(tok)
