"""Chat rendering equals the tokenizer's own ``apply_chat_template``, and only assistant turns are trained.

Two tiny tokenizers are built here (BPE trained with ``tokenizers`` on a few sentences, no downloads),
with two different real-world-shaped templates: ChatML with a default system prompt (Qwen-like) and
a Gemma-like template that has no system role and renames the assistant 'model'.
"""
from __future__ import annotations

import json

import pytest

from trainer.config.sections import RunConfig
from trainer.core.errors import UserError
from trainer.data.conversations import DEFAULT_CHAT_TEMPLATE, segments

CHATML = ("{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
          "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
GEMMA = ("{{ bos_token }}{% for m in messages %}"
         "{% if m['role'] not in ['user', 'assistant'] %}{{ raise_exception(m['role'] + ' role not supported') }}{% endif %}"
         "{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
         "<start_of_turn>{{ role }}\n{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
         "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
SPECIALS = {"chatml": ["<|im_start|>", "<|im_end|>"], "gemma": ["<start_of_turn>", "<end_of_turn>"]}
CONVERSATION = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Where does the cat sleep?"},
    {"role": "assistant", "content": "The cat sleeps near the river."},
    {"role": "user", "content": "And the dog?"},
    {"role": "assistant", "content": "The dog sleeps in the park."},
]


@pytest.fixture(scope="module")
def base_tokenizer_dir(tmp_path_factory):
    from trainer.worker.datapipe.tokenizer import train_bpe

    folder = tmp_path_factory.mktemp("tok") / "bpe"
    texts = [r["content"] for r in CONVERSATION] * 20 + ["hello world, where is the robot? near the bridge."] * 20
    train_bpe(texts, folder, 400)
    return folder


def tokenizer(folder, kind: str):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(folder))
    tok.add_special_tokens({"additional_special_tokens": SPECIALS[kind]})
    tok.chat_template = CHATML if kind == "chatml" else GEMMA
    return tok


def encode(tok, records: list[dict], fmt: str = "chat", **data):
    from trainer.worker.datapipe.rendering import JSON_COLUMN, Encoder

    cfg = RunConfig.model_validate({"data": {"path": "x.jsonl", **data}})
    enc = Encoder(cfg, tok, fmt, "x.jsonl")
    return enc({JSON_COLUMN: [json.dumps(r) for r in records]}, list(range(len(records))))


def expected_labels(tok, msgs: list[dict]) -> list[int]:
    """Labels built independently: token counts of apply_chat_template on conversation prefixes; each turn is
    trained through its first stop token (where generation stops: eos, or the template's end-of-turn token
    ``<|im_end|>``/``<end_of_turn>``), not the newline the template adds after."""
    ids = tok.apply_chat_template(msgs, tokenize=True)["input_ids"]
    stops = {tok.eos_token_id, *tok.convert_tokens_to_ids([SPECIALS["chatml"][1], SPECIALS["gemma"][1]])} - {None}
    labels = [-100] * len(ids)
    for i, m in enumerate(msgs):
        if m["role"] == "assistant":
            start = len(tok.apply_chat_template(msgs[:i], tokenize=True, add_generation_prompt=True)["input_ids"])
            end = len(tok.apply_chat_template(msgs[: i + 1], tokenize=True)["input_ids"])
            end = next((j + 1 for j in range(start, end) if ids[j] in stops), end)
            labels[start:end] = ids[start:end]
    return labels


@pytest.mark.parametrize("kind,msgs", [("chatml", CONVERSATION), ("gemma", CONVERSATION[1:])],
                         ids=["chatml-with-system", "gemma-without-system"])
def test_multi_turn_ids_equal_apply_chat_template_and_only_assistant_is_trained(base_tokenizer_dir, kind, msgs):
    tok = tokenizer(base_tokenizer_dir, kind)
    out = encode(tok, [{"messages": msgs}])
    ids, labels = out["input_ids"][0], out["labels"][0]
    assert ids == tok.apply_chat_template(msgs, tokenize=True)["input_ids"]
    assert labels == expected_labels(tok, msgs)
    eot = tok.convert_tokens_to_ids(SPECIALS[kind][1])
    trained_eot = [i for i, (t, lab) in enumerate(zip(ids, labels)) if t == eot and lab == eot]
    assert len(trained_eot) == 2, "both assistant turns end with a trained end-of-turn token"
    masked_text = tok.decode([t for t, lab in zip(ids, labels) if lab == -100])
    trained_text = tok.decode([t for t, lab in zip(ids, labels) if lab != -100])
    assert "Where does the cat sleep?" in masked_text and "And the dog?" in masked_text
    assert "near the river" in trained_text and "in the park" in trained_text
    assert "Where" not in trained_text and "Answer briefly" not in trained_text


def test_train_on_prompt_trains_everything(base_tokenizer_dir):
    tok = tokenizer(base_tokenizer_dir, "chatml")
    out = encode(tok, [{"messages": CONVERSATION}], train_on_prompt=True)
    assert out["labels"][0] == out["input_ids"][0]


def test_sharegpt_and_alpaca_go_through_the_same_template(base_tokenizer_dir):
    tok = tokenizer(base_tokenizer_dir, "chatml")
    share = {"conversations": [{"from": "human", "value": "Where does the cat sleep?"},
                               {"from": "gpt", "value": "The cat sleeps near the river."}]}
    alpaca = {"instruction": "Where does the cat sleep?", "input": "", "output": "The cat sleeps near the river."}
    as_chat = [{"role": "user", "content": "Where does the cat sleep?"},
               {"role": "assistant", "content": "The cat sleeps near the river."}]
    want = tok.apply_chat_template(as_chat, tokenize=True)["input_ids"]
    assert encode(tok, [share], "sharegpt")["input_ids"][0] == want
    assert encode(tok, [alpaca], "alpaca")["input_ids"][0] == want
    assert encode(tok, [alpaca], "alpaca")["labels"][0] == expected_labels(tok, as_chat)


def test_role_the_template_rejects_names_file_line_and_field(base_tokenizer_dir):
    tok = tokenizer(base_tokenizer_dir, "gemma")
    tool_turn = CONVERSATION[1:3] + [{"role": "tool", "content": "42"}]
    with pytest.raises(UserError) as err:
        encode(tok, [{"messages": tool_turn}])
    msg = str(err.value)
    assert "x.jsonl" in msg and "record 1" in msg and "'messages'" in msg and "tool role not supported" in msg
    assert "data.chat_template" in msg


def test_system_role_the_template_rejects_is_merged_or_refused_as_configured(base_tokenizer_dir):
    tok = tokenizer(base_tokenizer_dir, "gemma")
    merged = [{"role": "user", "content": "Answer briefly.\n\nWhere does the cat sleep?"}] + CONVERSATION[2:]
    assert encode(tok, [{"messages": CONVERSATION}]) == encode(tok, [{"messages": merged}])
    with pytest.raises(UserError) as err:
        encode(tok, [{"messages": CONVERSATION}], system_message="error")
    assert "record 1" in str(err.value) and "data.system_message" in str(err.value)


def test_default_template_for_a_tokenizer_without_one(base_tokenizer_dir, tmp_path):
    from transformers import PreTrainedTokenizerFast

    from trainer.worker.datapipe.rendering import set_chat_template

    tok = PreTrainedTokenizerFast.from_pretrained(str(base_tokenizer_dir))
    assert not tok.chat_template
    cfg = RunConfig.model_validate({"data": {"path": "x.jsonl"}})
    assert set_chat_template(tok, cfg.data, "chat") == DEFAULT_CHAT_TEMPLATE
    out = encode(tok, [{"messages": CONVERSATION}])
    assert out["input_ids"][0] == tok.apply_chat_template(CONVERSATION, tokenize=True)["input_ids"]
    assert out["labels"][0] == expected_labels(tok, CONVERSATION)
    tok.save_pretrained(str(tmp_path / "final"))  # what the worker does with final/
    again = PreTrainedTokenizerFast.from_pretrained(str(tmp_path / "final"))
    assert again.chat_template == DEFAULT_CHAT_TEMPLATE
    assert again.apply_chat_template(CONVERSATION, tokenize=False) == tok.apply_chat_template(CONVERSATION, tokenize=False)


def test_segments_concatenate_to_the_text():
    text = "abcdefghij"
    parts = segments(text, [(2, 4), (6, 10)])
    assert "".join(p["text"] for p in parts) == text
    assert [(p["text"], p["trained"]) for p in parts] == [("ab", False), ("cd", True), ("ef", False), ("ghij", True)]


def test_packed_documents_do_not_attend_into_each_other():
    """The collator's packed batch (position_ids restarting, no attention mask) gives each document the
    logits it has alone: transformers builds a block-diagonal mask from the position ids."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer.worker.datapipe.pipeline import PackTable
    from trainer.worker.datapipe.sequences import Collator

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")).eval()
    import pyarrow as pa

    docs = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
    table = pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32())), "labels": pa.array(docs, pa.list_(pa.int32()))})
    block = PackTable(12)(table).to_pylist()[0]
    assert block["position_ids"] == [0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4]
    batch = Collator(0)([block])
    assert "attention_mask" not in batch
    with torch.no_grad():
        # use_cache=False as in training (the worker sets it): with a cache transformers keeps the plain causal mask
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits[0]
        alone = model(input_ids=torch.tensor([docs[1]]), use_cache=False).logits[0]
        crossed = model(input_ids=batch["input_ids"], use_cache=False).logits[0]  # plain causal: attends across
    assert torch.allclose(packed[4:7], alone, atol=1e-5)
    assert not torch.allclose(crossed[4:7], alone, atol=1e-3), "the check can tell the two apart"


def _history_rewriting_render(msgs: list[dict], gen: bool) -> str:
    """A Qwen3-shaped template in Python: reasoning is kept only after the last user turn; a system
    message goes into the last user turn (Mistral Nemo's habit)."""
    last_user = max((i for i, m in enumerate(msgs) if m["role"] == "user"), default=-1)
    system = next((m["content"] for m in msgs if m["role"] == "system"), None)
    out = ""
    for i, m in enumerate(msgs):
        if m["role"] == "user":
            text = f"{system}\n\n{m['content']}" if system and i == last_user else m["content"]
            out += f"<u>{text}<eot>\n"
        elif m["role"] == "assistant":
            text = m["content"] if i > last_user else m["content"].split("</think>")[-1]
            out += f"<a>{text}<eot>\n"
    return out + ("<a>" if gen else "")


def _marker_encode(texts: list[str]):
    """A tokenizer in Python for the chat-rules tests: each ``<tag>`` is one token, every other character one."""
    import re

    out = []
    for text in texts:
        found = list(re.finditer(r"<[a-z/]+>|.", text, re.S))
        out.append(([sum(map(ord, m.group())) * 7 + len(m.group()) for m in found], [m.span() for m in found]))
    return out


def _chat(render, stops=("<eot>",)):
    from trainer.data.conversations import Chat

    return Chat(render, _marker_encode, [_marker_encode([s])[0][0][0] for s in stops])


def test_templates_that_rewrite_history_give_one_sequence_per_turn_as_inference_sees_it():
    msgs = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "<think>add</think>4."}, {"role": "user", "content": "3+3?"},
            {"role": "assistant", "content": "<think>again</think>6."}]
    got = _chat(_history_rewriting_render).examples(msgs)
    prompts = ["<u>Be terse.\n\n2+2?<eot>\n<a>", "<u>2+2?<eot>\n<a>4.<eot>\n<u>Be terse.\n\n3+3?<eot>\n<a>"]
    answers = ["<think>add</think>4.<eot>", "<think>again</think>6.<eot>"]
    assert [(ex.text, ex.spans) for ex in got] == [(p + a, [(len(p), len(p + a))]) for p, a in zip(prompts, answers)]
    for ex, p, a in zip(got, prompts, answers):
        assert ex.ids == _marker_encode([p + a])[0][0]
        assert ex.labels == [-100] * len(_marker_encode([p])[0][0]) + _marker_encode([a])[0][0]
    plain = [m if m["role"] != "assistant" else {**m, "content": m["content"].split("</think>")[-1]} for m in msgs[1:]]
    [ex] = _chat(_history_rewriting_render).examples(plain)
    assert [ex.text[a:b] for a, b in ex.spans] == ["4.<eot>", "6.<eot>"], "a prefix-consistent render stays one sequence"


def _thinking_block_render(msgs: list[dict], gen: bool) -> str:
    """Command R7B's shape in Python: the prompt always ends with an empty thinking block, a rendered answer opens
    with its own start token instead."""
    out = "".join(f"<t><u>{m['content']}<e>" if m["role"] == "user" else f"<t><c><r>{m['content']}<x><e>"
                  for m in msgs)
    return out + "<t><c><s><z>"


def test_the_boundary_never_cuts_a_special_token():
    """Characters of ``<s>`` (the prompt's thinking block) and ``<r>`` (the answer's start) agree up to ``<``: a
    character compare cut there and trained ``r>`` as text; on token ids the answer starts at ``<r>``."""
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
            {"role": "user", "content": "bye"}, {"role": "assistant", "content": "ciao"}]
    chat = _chat(_thinking_block_render, stops=("<e>",))
    turn = chat.turn(msgs, 1)
    assert turn.prompt_text == "<t><u>hi<e><t><c><s><z>" and turn.answer_text == "<r>yo<x><e>"
    assert turn.answer == _marker_encode(["<r>yo<x><e>"])[0][0]
    examples = chat.examples(msgs)
    assert [ex.text[a:b] for ex in examples for a, b in ex.spans] == ["<r>yo<x><e>", "<r>ciao<x><e>"]
    assert all(ex.ids[:len(_marker_encode([ex.text[:ex.spans[0][0]]])[0][0])] ==
               chat.prompt_ids(msgs[:2 * i + 1]) for i, ex in enumerate(examples)), "each prompt is inference's"
    assert chat.end_of_turn_id() == _marker_encode(["<e>"])[0][0][0]


def test_system_message_actions():
    from trainer.data.conversations import system_action, with_system_message

    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]
    assert [system_action(msgs, mode, False) for mode in ("auto", "merge", "drop", "error")] == \
        ["merged", "merged", "dropped", "refused"]
    assert [system_action(msgs, mode, True) for mode in ("auto", "merge", "drop", "error")] == \
        ["kept", "merged", "dropped", "kept"]
    assert system_action(msgs[1:], "error", False) == "none"
    assert with_system_message(msgs, "merged") == [{"role": "user", "content": "S\n\nU"}, msgs[2]]
    assert with_system_message(msgs, "dropped") == msgs[1:]


def test_a_record_is_found_by_its_line_only_when_a_message_names_it(base_tokenizer_dir, monkeypatch, tmp_path):
    """Finding a record's line reads the file up to it; done for every record it made tokenizing quadratic in the
    file's length (5,000 chat records: 37.6 s to the error at line 4,322, 13.0 s once only the error asks)."""
    from trainer.worker.datapipe import rendering

    asked = []
    monkeypatch.setattr(rendering, "record_line", lambda path, index: asked.append(index) or f"line {index + 1}")
    tok = tokenizer(base_tokenizer_dir, "gemma")
    out = encode(tok, [{"messages": CONVERSATION[1:]}] * 50)
    assert len(out["input_ids"]) == 50 and asked == []
    with pytest.raises(UserError, match="line 2, field 'messages'"):
        encode(tok, [{"messages": CONVERSATION[1:]}, {"messages": [{"role": "tool", "content": "x"}, *CONVERSATION[1:]]}])
    assert asked == [1]
