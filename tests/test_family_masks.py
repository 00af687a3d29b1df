"""Assistant-only masks are exact for the real chat templates of popular families (tests/real_models.py).

For every assistant turn ``i`` the training data holds a sequence that starts with exactly the ids
inference gives the model for that turn (``apply_chat_template(messages[:i], add_generation_prompt=True)``)
followed by the ids of the answer the family's template renders + its end-of-turn, and those answer ids
are the only trained labels. The expected answers are written out per family below (not derived
from the code under test).
"""
from __future__ import annotations

import functools
import json

import pytest

import real_models as rm
from trainer.config.sections import RunConfig

END = {"qwen2.5": "<|im_end|>", "qwen3": "<|im_end|>", "deepseek-r1-distill": "<｜end▁of▁sentence｜>",
       "llama-3.2": "<|eot_id|>", "llama-3.1": "<|eot_id|>", "mistral-nemo": "</s>", "llama-2": "</s>", "phi-3.5": "<|end|>",
       "gemma-2": "<end_of_turn>", "command-r7b": "<|END_RESPONSE|><|END_OF_TURN_TOKEN|>",
       "granite-3.3": "<|end_of_text|>", "qwen3-moe": "<|im_end|>", "gpt-oss": "<|return|>", "gemma-3": "<end_of_turn>"}
# What each family's model writes before its answer text at inference (after the generation prompt): Command R7B's
# prompt ends with an empty thinking block, its answer opens with <|START_RESPONSE|> (a whole token, never cut).
OPENS = {"qwen3": "<think>\n\n</think>\n\n", "qwen3-moe": "<think>\n\n</think>\n\n",
         "gpt-oss": "<|channel|>final<|message|>", "command-r7b": "<|START_RESPONSE|>"}
NO_SYSTEM = ("gemma-2", "gemma-3")  # templates that refuse a system role
SYSTEM = {"role": "system", "content": "You are terse."}
TURNS = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."},
         {"role": "user", "content": "And 3+3?"}, {"role": "assistant", "content": "6, of course."}]
CALL = {"id": "call12345", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
TOOLS = [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": "", "tool_calls": [CALL]},
         {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "sunny"},
         {"role": "assistant", "content": "It is sunny in Paris."}]
REASONING = [{"role": "user", "content": "What is 2+2?"},
             {"role": "assistant", "content": "<think>\nAdd two and two.\n</think>\n\n4."},
             {"role": "user", "content": "And 3+3?"}, {"role": "assistant", "content": "<think>\nAgain.\n</think>\n\n6."}]
TOOL_FAMILIES = ["qwen2.5", "qwen3", "deepseek-r1-distill", "llama-3.2", "llama-3.1", "mistral-nemo"]


@functools.lru_cache(maxsize=None)
def _tok(name):
    """The family's tokenizer as a run loads it (the tokenizer.json as shipped)."""
    from trainer.worker.datapipe.tokenizer import load_pretrained
    return load_pretrained(rm.family_dir(name))


def encode(name: str, msgs: list[dict], **data) -> list[tuple[list[int], list[int]]]:
    """``[(input_ids, labels)]`` of one conversation, as the training data pipeline makes them."""
    from trainer.worker.datapipe.rendering import JSON_COLUMN, Encoder
    cfg = RunConfig.model_validate({"model": {"source": str(rm.family_dir(name))}, "data": {"path": "x.jsonl", **data}})
    out = Encoder(cfg, _tok(name), "chat", "x.jsonl")({JSON_COLUMN: [json.dumps({"messages": msgs})]}, [0])
    return list(zip(out["input_ids"], out["labels"]))


def inference(name: str, msgs: list[dict], i: int, answer: str) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids) of turn ``i`` at inference: the prompt as a chat front end sends it, the
    answer as the model continues it (checked to tokenize the same way after the prompt)."""
    tok = _tok(name)
    prompt = tok.apply_chat_template(msgs[:i], add_generation_prompt=True, tokenize=False)
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    assert prompt_ids == tok.apply_chat_template(msgs[:i], add_generation_prompt=True)["input_ids"]
    whole = tok(prompt + answer, add_special_tokens=False)["input_ids"]
    assert whole[:len(prompt_ids)] == prompt_ids, "the answer does not merge into the prompt's last token"
    return prompt_ids, whole[len(prompt_ids):]


def check_turns(name: str, msgs: list[dict], answers: dict[int, str]) -> None:
    """Every assistant turn ``i`` (answer text ``answers[i]``) is trained exactly, nothing else is."""
    examples = encode(name, msgs)
    tok = _tok(name)
    for ids, labels in examples:
        assert len(ids) == len(labels)
        if tok.bos_token_id is not None and tok.bos_token_id != tok.eos_token_id:  # Granite's BOS ends turns too
            assert ids.count(tok.bos_token_id) <= 1, "BOS doubled"
    want_trained = 0
    for i, answer in answers.items():
        prompt_ids, answer_ids = inference(name, msgs, i, answer)
        n, m = len(prompt_ids), len(answer_ids)
        hits = [(ids, labels) for ids, labels in examples if ids[:n] == prompt_ids and ids[n:n + m] == answer_ids]
        assert hits, f"turn {i}: no training sequence starts with its inference prompt + {answer!r}"
        assert any(labels[n:n + m] == answer_ids for _ids, labels in hits), f"turn {i}: answer not trained"
        want_trained += m
    assert sum(sum(lab != -100 for lab in labels) for _ids, labels in examples) == want_trained


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow]) if n == "gemma-3" else n  # 262k vocab:
                                  for n in sorted(rm.FAMILIES)])                                     # seconds to load
def test_multi_turn_masks_are_exact(name):
    msgs = TURNS if name in NO_SYSTEM else [SYSTEM] + TURNS
    first = 2 if msgs[0]["role"] == "system" else 1
    answers = {first: OPENS.get(name, "") + "4." + END[name], first + 2: OPENS.get(name, "") + "6, of course." + END[name]}
    check_turns(name, msgs, answers)


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow]) if n == "gemma-3" else n
                                  for n in sorted(rm.FAMILIES)])
def test_content_parts_without_pictures_train_as_text_does(name):
    """OpenAI-style content parts (``[{"type": "text", "text": ...}]``) train exactly what the same text does: the
    answers are not lost to a template that prints only a string (or prints the list as Python text)."""
    msgs = TURNS if name in NO_SYSTEM else [SYSTEM] + TURNS
    parts = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in msgs]
    assert encode(name, parts) == encode(name, msgs)


@pytest.mark.parametrize("name", ["qwen3", "deepseek-r1-distill"])
def test_templates_that_drop_earlier_reasoning_train_each_turn_as_inference_sees_it(name):
    if name == "qwen3":  # kept for the turn being answered, dropped from earlier turns
        answers = {1: "<think>\nAdd two and two.\n</think>\n\n4.<|im_end|>", 3: "<think>\nAgain.\n</think>\n\n6.<|im_end|>"}
    else:  # DeepSeek-R1's template cuts every turn after "</think>"; its generation prompt closes the reasoning
        answers = {1: "\n\n4." + END[name], 3: "\n\n6." + END[name]}
    check_turns(name, REASONING, answers)
    if name == "qwen3":
        assert len(encode(name, REASONING)) == 2, "one training sequence per assistant turn"


@pytest.mark.parametrize("name", TOOL_FAMILIES)
def test_tool_calls_and_results(name):
    examples = encode(name, TOOLS)
    tok = _tok(name)
    trained = [tok.decode([t for t in labels if t != -100]) for _ids, labels in examples]
    assert any("get_weather" in t and "Paris" in t for t in trained), "the tool call is trained"
    assert any("It is sunny in Paris." in t for t in trained)
    assert not any("sunny\"" in t or t.count("sunny") > 1 for t in trained), "the tool result is not trained"
    assert all(t.endswith(END[name]) or END[name] in t for t in trained if t)
    prompt_ids, answer_ids = inference(name, TOOLS, 3, OPENS.get(name, "") + "It is sunny in Paris." + END[name])
    n = len(prompt_ids)
    assert any(ids[:n] == prompt_ids and labels[n:] [:len(answer_ids)] == answer_ids for ids, labels in examples)


def test_generation_markers_decide_what_is_trained_where_the_template_has_them():
    from trainer.data.conversations import DEFAULT_CHAT_TEMPLATE
    tok = _tok("qwen2.5")
    marked = DEFAULT_CHAT_TEMPLATE.replace(
        "{%- if message['content'] is string %}",
        "{%- if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}"
        "{%- elif message['content'] is string %}")
    saved, tok.chat_template = tok.chat_template, marked
    try:
        [(ids, labels)] = encode("qwen2.5", [SYSTEM] + TURNS)
        want = tok.apply_chat_template([SYSTEM] + TURNS, return_dict=True, return_assistant_tokens_mask=True)
    finally:
        tok.chat_template = saved
    assert ids == want["input_ids"]
    assert [lab != -100 for lab in labels] == [bool(m) for m in want["assistant_masks"]]
    assert tok.decode([t for t in labels if t != -100]) == "4.<|im_end|>6, of course.<|im_end|>"


MERGED = [{"role": "user", "content": "You are terse.\n\nWhat is 2+2?"}] + TURNS[1:]


def test_gemma_without_a_system_role_gets_the_system_text_in_the_first_user_turn():
    assert encode("gemma-2", [SYSTEM] + TURNS) == encode("gemma-2", MERGED)  # data.system_message: auto
    check_turns("gemma-2", MERGED, {1: "4.<end_of_turn>", 3: "6, of course.<end_of_turn>"})
    assert encode("gemma-2", [SYSTEM] + TURNS, system_message="drop") == encode("gemma-2", TURNS)


def test_system_message_error_names_the_line_and_the_setting():
    from trainer.core.errors import UserError
    with pytest.raises(UserError) as err:
        encode("gemma-2", [SYSTEM] + TURNS, system_message="error")
    msg = str(err.value)
    assert "x.jsonl" in msg and "record 1" in msg and "data.system_message" in msg and "merge" in msg
    assert encode("qwen2.5", [SYSTEM] + TURNS, system_message="error")  # a template with a system role takes it


def test_merge_and_drop_apply_to_templates_with_a_system_role_too():
    assert encode("qwen2.5", [SYSTEM] + TURNS, system_message="merge") == encode("qwen2.5", MERGED)
    assert encode("llama-3.2", [SYSTEM] + TURNS, system_message="drop") == encode("llama-3.2", TURNS)
    assert encode("qwen2.5", [SYSTEM] + TURNS) != encode("qwen2.5", MERGED)  # auto keeps it where it can


@pytest.mark.slow  # the report tokenizes in a child process (~8 s)
def test_data_report_says_what_happens_to_system_messages(tmp_path, monkeypatch):
    from trainer.cli.data import render_text
    from trainer.worker.probes.data_report import report
    monkeypatch.setenv("TRAINPILOT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": [SYSTEM] + TURNS}) + "\n", encoding="utf-8")
    cfg = RunConfig.model_validate({"model": {"source": str(rm.family_dir("gemma-2"))},
                                    "data": {"path": str(path), "seq_len": 256}})
    r = report(cfg, examples=1)
    assert r["system_message"] == {"setting": "auto", "template_has_system_role": False, "action": "merged"}
    masked = "".join(s["text"] for s in r["examples"][0]["segments"] if not s["trained"])
    trained = "".join(s["text"] for s in r["examples"][0]["segments"] if s["trained"])
    assert "<start_of_turn>user\nYou are terse.\n\nWhat is 2+2?<end_of_turn>" in masked
    assert trained == "4.<end_of_turn>6, of course.<end_of_turn>"
    assert "system:   system text put at the start of the first user turn (the chat template has no system role; " \
           "data.system_message: auto)" in render_text(r)


@pytest.mark.slow  # the report tokenizes in a child process (~8 s)
def test_data_report_says_in_words_what_only_the_render_shows(tmp_path, monkeypatch):
    """Issue 29 item 7: Gemma's folded system prompt and Qwen3's empty think block were visible only in the rendered
    text; the report says them in words (the Data page shows the same sentences)."""
    from trainer.cli.data import render_text
    from trainer.data.conversations import rendering_notes
    from trainer.worker.probes.data_report import report
    monkeypatch.setenv("TRAINPILOT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": [SYSTEM] + TURNS}) + "\n", encoding="utf-8")
    notes = {}
    for family in ("qwen3", "gemma-2", "qwen2.5"):
        cfg = RunConfig.model_validate({"model": {"source": str(rm.family_dir(family))},
                                        "data": {"path": str(path), "seq_len": 256}})
        r = report(cfg, examples=1)
        notes[family] = rendering_notes(r)
        assert r["empty_think_block"] is (family == "qwen3")
        assert ("thinking: " in render_text(r)) is (family == "qwen3")
    assert len(notes["qwen3"]) == 1 and "empty reasoning block (<think></think>)" in notes["qwen3"][0]
    assert len(notes["gemma-2"]) == 1 and "start of the first user turn" in notes["gemma-2"][0]
    assert notes["qwen2.5"] == []
    reasoning = tmp_path / "reasoning.jsonl"  # the records' own reasoning: not the template's doing
    reasoning.write_text(json.dumps({"messages": REASONING}) + "\n", encoding="utf-8")
    cfg = RunConfig.model_validate({"model": {"source": str(rm.family_dir("qwen3"))},
                                    "data": {"path": str(reasoning), "seq_len": 256}})
    assert report(cfg, examples=1)["empty_think_block"] is False
