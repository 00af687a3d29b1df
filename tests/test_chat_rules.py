"""The chat rules (``trainer.data.conversations``) as every objective and the export use them, on the real tiny
families' tokenizers and templates (tests/real_models.py): the system rule for GRPO and preference prompts (Gemma
has no system role), Qwen3's reasoning kept out of the compared answer, a template's date pinned to the run's, the
system prompt every record shares, and the Modelfile checks verify-export runs (no llama.cpp needed for these)."""
from __future__ import annotations

import functools
import json

import pytest

import real_models as rm
from trainer.config.sections import RunConfig
from trainer.core.errors import UserError
from trainer.data import conversations


@functools.lru_cache(maxsize=None)
def _tok(name):
    from trainer.worker.datapipe.tokenizer import load_pretrained
    return load_pretrained(rm.family_dir(name))


def test_grpo_system_prompt_on_gemma_is_merged_not_a_template_error():
    from trainer.worker.datapipe import grpo_prompts

    msgs = grpo_prompts.render(_tok("gemma-2"), "What is 2+2?", "Answer with a number.")
    assert msgs == [{"role": "user", "content": "Answer with a number.\n\nWhat is 2+2?"}]
    text = grpo_prompts.prompt_text(_tok("gemma-2"), msgs)
    assert text.endswith("<start_of_turn>user\nAnswer with a number.\n\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n")
    with pytest.raises(UserError, match="data.system_message") as err:
        grpo_prompts.render(_tok("gemma-2"), "What is 2+2?", "Answer with a number.", "line 3", "error")
    assert "line 3" in str(err.value) and "'merge'" in str(err.value)
    kept = grpo_prompts.render(_tok("qwen2.5"), "What is 2+2?", "Answer with a number.")
    assert kept[0] == {"role": "system", "content": "Answer with a number."}, "a template with a system role keeps it"


def test_grpo_on_qwen3_prompts_as_inference_does_and_compares_the_answer_after_the_reasoning():
    from trainer.data import rewards
    from trainer.worker.datapipe import grpo_prompts

    msgs = grpo_prompts.render(_tok("qwen3"), "What is 2+2?", None)
    text = grpo_prompts.prompt_text(_tok("qwen3"), msgs)
    assert text == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert grpo_prompts.prompt_ids(_tok("qwen3"), msgs) == _tok("qwen3")(text, add_special_tokens=False).input_ids
    thought = [{"role": "assistant", "content": "<think>\nTwo and two make four.\n</think>\n\n4"}]
    assert rewards.final_answer(thought) == "4"
    assert rewards.final_answer([{"role": "assistant", "content": "<think>\n\n</think>\n\n#### 12"}]) == "12"


@pytest.mark.slow  # measured >= 3.5 s on the 2-core machine
def test_preference_prompts_follow_the_system_rule():
    from trainer.worker.train.objectives import _system_rule

    rows = [{"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
             "chosen": [{"role": "assistant", "content": "a"}], "rejected": [{"role": "assistant", "content": "b"}]}]
    d = RunConfig.model_validate({"data": {"path": "x.jsonl"}}).data
    assert _system_rule(_tok("gemma-2"), d, rows, "x.jsonl")[0]["prompt"] == [{"role": "user", "content": "S\n\nU"}]
    assert _system_rule(_tok("qwen2.5"), d, rows, "x.jsonl")[0]["prompt"] == rows[0]["prompt"]
    d_error = RunConfig.model_validate({"data": {"path": "x.jsonl", "system_message": "error"}}).data
    with pytest.raises(UserError, match="record 1, field 'prompt'"):
        _system_rule(_tok("gemma-2"), d_error, rows, "x.jsonl")


def test_a_template_that_prints_the_date_prints_the_runs_date():
    tok = _tok("granite-3.3")
    conversations.pin_date(tok, "2026-01-02")
    hi = [{"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(hi, tokenize=False, add_generation_prompt=True)
    assert "Today's Date: January 02, 2026." in text
    pinned = conversations.pinned_template(rm.template_text("granite-3.3"), "2026-01-02")
    assert "2026-01-02 (data.chat_date)" in pinned
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)  # llama-cpp-python's Jinja settings
    env.globals["strftime_now"] = lambda fmt: "TODAY"  # what llama.cpp's formatter passes: the template's own wins
    assert "Today's Date: January 02, 2026." in env.from_string(pinned).render(messages=hi, add_generation_prompt=True)
    assert conversations.pinned_template(rm.template_text("qwen2.5"), "2026-01-02") == rm.template_text("qwen2.5")
    assert RunConfig.model_validate({"data": {"chat_date": "2026-01-02"}}).data.chat_date == "2026-01-02"
    from trainer.config.loading import validate
    from trainer.config.messages import ConfigError
    with pytest.raises(ConfigError, match="data.chat_date.*YYYY-MM-DD"):
        validate({"data": {"chat_date": "Jan 2"}})


def test_the_run_pins_its_date_when_the_config_leaves_it_null(monkeypatch):
    import time

    from trainer.supervisor import create

    monkeypatch.setattr(create, "as_resolved", lambda cfg: cfg)  # the planner's resolution is not what is tested
    cfg = RunConfig.model_validate({"device": "cpu"})
    assert create.pin_chat_date(cfg).data.chat_date == time.strftime("%Y-%m-%d")
    kept = RunConfig.model_validate({"device": "cpu", "data": {"chat_date": "2025-05-05"}})
    assert create.pin_chat_date(kept).data.chat_date == "2025-05-05"


def test_a_system_prompt_shared_by_every_record_is_found():
    def convo(system):
        return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": "q"}]
    assert conversations.shared_system_prompt([convo("A"), convo("A")]) == "A"
    assert conversations.shared_system_prompt([convo("A"), convo("B")]) is None
    assert conversations.shared_system_prompt([convo("A"), convo(None)]) is None


def _case(raw, tok):
    from trainer.worker.export.run_records import Case

    chat = conversations.for_tokenizer(tok)
    msgs = chat.with_system(raw)
    return Case(msgs, chat.prompt_ids(msgs), "validation record 1", raw)


def test_the_modelfile_check_finds_a_missing_stop_a_wrong_system_and_an_edited_template(tmp_path):
    from trainer.worker.export import modelfile_check, ollama

    tok = _tok("gemma-2")
    chat = conversations.for_tokenizer(tok)
    shape = ollama.check(tok)
    ollama.write_modelfile(tmp_path, "model-f16.gguf", "t", tok, chat, shape, 8192, "You are terse.")
    raw = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}]
    cases = [_case(raw, tok)]
    bos = tok.bos_token

    def want(case):
        return chat.render(case.messages, True)[len(bos):]
    record = {"gguf": "model-f16.gguf", "system": "You are terse."}
    stops = [tok.convert_ids_to_tokens(i) for i in ollama.stop_ids(tok, chat)]
    good = modelfile_check.check(tmp_path, record, cases, want, stops, 256)
    assert good["ok"] is True and good["equal"] == 1 and good["system"] == "You are terse.", good
    assert "<end_of_turn>" in good["stops"]
    path = tmp_path / "Modelfile"
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace('PARAMETER stop "<end_of_turn>"\n', ""), encoding="utf-8")
    bad = modelfile_check.check(tmp_path, record, cases, want, stops, 256)
    assert bad["ok"] is False and "PARAMETER stop lacks '<end_of_turn>'" in bad["differences"][0]
    path.write_text(text.replace("<start_of_turn>model\n", "<start_of_turn>assistant\n"), encoding="utf-8")
    bad = modelfile_check.check(tmp_path, record, cases, want, stops, 256)
    assert bad["ok"] is False and "the TEMPLATE renders" in bad["differences"][0]
    bad = modelfile_check.check(tmp_path, {**record, "system": None}, cases, want, stops, 256)
    assert any("SYSTEM is 'You are terse.'" in d for d in bad["differences"])
    path.write_text(text, encoding="utf-8")
    assert modelfile_check.check(tmp_path, record, cases, want, stops, 99999)["differences"][0].startswith(
        "PARAMETER num_ctx is '8192', below the 99999 tokens")


def test_verify_export_refuses_a_folder_that_is_not_an_export(tmp_path):
    from trainer.worker.export import verify

    with pytest.raises(UserError, match="not an export written by 'trainpilot-cli export-model --gguf'"):
        verify.read_record(tmp_path)
    (tmp_path / verify.RECORD).write_text(json.dumps({"gguf": "model-f16.gguf"}))
    with pytest.raises(UserError, match="model-f16.gguf\\) is missing"):
        verify.read_record(tmp_path)


def test_the_modelfile_check_of_a_vision_language_export_reads_both_froms_and_content_parts(tmp_path):
    """Issue 41, walkthrough finding 2: the check took the projector's FROM (the last) for the model's, and rendered
    a content-part message as the Python list's text ("User: [{'type': 'text', ..."): every SmolVLM export failed it."""
    from trainer.worker.export import modelfile_check, ollama

    tok = _tok("gemma-2")
    chat = conversations.for_tokenizer(tok)
    ollama.write_modelfile(tmp_path, "model-f16.gguf", "t", tok, chat, ollama.check(tok), 8192,
                           projector="mmproj-model-f16.gguf")
    raw = [{"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2+2?"}]}]
    case = _case(raw, tok)
    record = {"gguf": "model-f16.gguf", "mmproj": "mmproj-model-f16.gguf"}
    stops = [tok.convert_ids_to_tokens(i) for i in ollama.stop_ids(tok, chat)]

    def want(c):
        return chat.render(c.messages, True)[len(tok.bos_token):]
    good = modelfile_check.check(tmp_path, record, [case], want, stops, 256)
    assert good["ok"] is True and good["equal"] == 1, good
    path = tmp_path / "Modelfile"
    path.write_text(path.read_text().replace("FROM ./mmproj-model-f16.gguf\n", ""))
    bad = modelfile_check.check(tmp_path, record, [case], want, stops, 256)
    assert bad["differences"] == ["no second FROM names the projector './mmproj-model-f16.gguf': Ollama would read "
                                  "no pictures"]
