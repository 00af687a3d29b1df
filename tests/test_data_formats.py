"""Every record format from a small file: detected, checked (file/line/field), previewed by the data
report, and bad records refused with exit 2 before anything is written. Training runs: test_data_train.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_hub import FakeHub
from helpers_train import CLI, PREFLIGHT_TIMEOUT, REPO, tree_digest, write_jsonl, write_workspace_config

from trainer.config.sections import RunConfig
from trainer.core.errors import UserError
from trainer.data import formats
from trainer.data import scan

CHAT = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where is the cat?"},
                     {"role": "assistant", "content": "Near the river."}, {"role": "user", "content": "And the dog?"},
                     {"role": "assistant", "content": "In the park."}]}
TOOL_CHAT = {"messages": [{"role": "user", "content": "Look it up."},
                          {"role": "assistant", "content": None,
                           "tool_calls": [{"type": "function", "function": {"name": "find", "arguments": "{}"}}]},
                          {"role": "tool", "content": "asleep"}, {"role": "assistant", "content": "It is asleep."}]}
SHAREGPT = {"conversations": [{"from": "human", "value": "Where is the cat?"}, {"from": "gpt", "value": "Near the river."}]}
ALPACA = {"instruction": "Say where the cat is.", "input": "The cat is near the river.", "output": "Near the river."}
PREFERENCE = {"prompt": "Where is the cat?", "chosen": "Near the river.", "rejected": "I do not know."}
KTO = {"prompt": "Where is the cat?", "completion": "Near the river.", "label": True}
TEMPLATE = {"question": "Where is the cat?", "answer": "Near the river."}
PAIR = {"prompt": "Where is the cat?", "response": "Near the river."}
SAMPLES = {"text": [{"text": "The cat sleeps near the river."}, {"text": "A dog runs in the park."}],
           "chat": [CHAT, TOOL_CHAT], "sharegpt": [SHAREGPT], "alpaca": [ALPACA, dict(ALPACA, input="")],
           "preference": [PREFERENCE], "kto": [KTO, dict(KTO, label=False)], "template": [TEMPLATE],
           "prompt_response": [PAIR, {"prompt": "And the dog?", "response": "In the park."}]}
TEMPLATES = {"data.prompt_template": "Q: {question}\nA: ", "data.response_template": "{answer}"}


def data_cfg(**fields):
    return RunConfig.model_validate({"data": {"path": "x.jsonl", **fields}}).data


# -- detection and normalisation (light) -------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["text", "chat", "sharegpt", "alpaca", "preference", "kto", "prompt_response"])
def test_each_format_is_detected_from_its_fields(fmt):
    assert formats.record_format_of(SAMPLES[fmt]) == fmt
    assert formats.record_format_of(SAMPLES[fmt], data_cfg(record_format="text")) == "text", "the override wins"


@pytest.mark.parametrize("names", formats.PAIR_NAMES, ids="/".join)
def test_a_prompt_and_its_answer_under_the_common_names_is_a_pair(names):
    """Issue 29 item 5: {"prompt", "response"} and the like were read as plain text, and the suggested fix
    (data.text_field) would have trained on one field."""
    prompt, answer = names
    rec = {prompt: "Where is the cat?", answer: "Near the river.", "id": 7}
    assert formats.record_format_of([rec]) == "prompt_response" and formats.check_record(rec, "prompt_response") is None
    assert formats.to_messages(rec, "prompt_response") == [{"role": "user", "content": "Where is the cat?"},
                                                           {"role": "assistant", "content": "Near the river."}]
    assert formats.to_input_target(rec, "prompt_response") == ("Where is the cat?", "Near the river.")
    assert formats.check_record({prompt: "a", answer: 3}, "prompt_response")[0] == answer
    assert "prompt_response" in formats.TRAINABLE_FORMATS and "prompt_response" in formats.CONVERSATION_FORMATS


def test_the_named_pair_formats_keep_their_own_shape():
    assert formats.record_format_of([{"prompt": "a", "completion": "b"}]) == "prompt_completion"
    assert formats.record_format_of([ALPACA]) == "alpaca"  # instruction + input + output: not input/output
    assert formats.record_format_of([TEMPLATE], data_cfg(prompt_template="{question}", response_template="{answer}")) \
        == "template"
    assert formats.record_format_of([PAIR], data_cfg(record_format="text")) == "text"  # set: the user's
    # a full text beside its question and answer (the bundled demo: its training and the overhead benchmark's bare
    # script read the text) is text; the pair stays there for GRPO's prompts and references
    assert formats.record_format_of([dict(PAIR, text="The cat sleeps near the river.")]) == "text"
    from trainer.data.readers import read_records

    assert formats.record_format_of(read_records("demo", "auto").rows) == "text"


def test_records_without_the_text_field_get_a_fix_that_keeps_both_fields(tmp_path):
    path = write_jsonl(tmp_path / "odd.jsonl", [{"ask": "Where is the cat?", "reply": "Near the river."}])
    with pytest.raises(UserError) as err:
        scan.scan(str(path), data_cfg(path=str(path)))
    assert "data.prompt_template: '{ask}'" in str(err.value) and "data.response_template: '{reply}'" in str(err.value)


def test_templates_configured_mean_template_format():
    assert formats.record_format_of([TEMPLATE], data_cfg(prompt_template="Q: {question}", response_template="{answer}")) \
        == "template"


def test_normalised_records_for_preference_training():
    assert formats.to_preference(PREFERENCE) == PREFERENCE
    implicit = {"chosen": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
                "rejected": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Go away."}]}
    assert formats.to_preference(implicit) == {"prompt": [{"role": "user", "content": "Hi"}],
                                               "chosen": [{"role": "assistant", "content": "Hello!"}],
                                               "rejected": [{"role": "assistant", "content": "Go away."}]}
    assert formats.to_kto(dict(KTO, label="false")) == dict(KTO, label=False)
    assert formats.check_record(dict(KTO, label="maybe"), "kto")[0] == "label"


def test_conversations_become_messages_with_tool_turns_passed_through():
    assert formats.to_messages(SHAREGPT, "sharegpt") == [{"role": "user", "content": "Where is the cat?"},
                                                         {"role": "assistant", "content": "Near the river."}]
    assert formats.to_messages(ALPACA, "alpaca")[0]["content"] == "Say where the cat is.\n\nThe cat is near the river."
    msgs = formats.to_messages(TOOL_CHAT, "chat")
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant"] and "tool_calls" in msgs[1]


@pytest.mark.parametrize("whole_file", [True, False], ids=["read-whole", "streamed"])
def test_record_that_does_not_match_names_file_line_and_field(tmp_path, monkeypatch, whole_file):
    if not whole_file:
        monkeypatch.setattr(scan, "WHOLE_FILE_BYTES", 0)  # the line-by-line pass large files get
    monkeypatch.setenv("TRAINPILOT_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(CHAT) + "\n\n" + json.dumps(CHAT) + "\n" + json.dumps({"messages": "hello"}) + "\n")
    with pytest.raises(UserError) as err:
        scan.scan(str(path), data_cfg(path=str(path)))
    msg = str(err.value)
    assert str(path) in msg and "line 4" in msg and "field 'messages'" in msg and "record_format" in msg


def test_scan_counts_every_record_and_is_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(scan, "WHOLE_FILE_BYTES", 0)
    monkeypatch.setenv("TRAINPILOT_CACHE", str(tmp_path / "cache"))
    path = write_jsonl(tmp_path / "train.jsonl", [CHAT, SHAREGPT | {"messages": CHAT["messages"]}], repeat=60)
    first = scan.scan(str(path), data_cfg(path=str(path)))
    assert (first.record_format, first.records) == ("chat", 120)
    assert list((tmp_path / "cache" / "scans").glob("*.json")), "the verdict is cached"
    assert scan.scan(str(path), data_cfg(path=str(path))) == first


# -- the data report (worker room, in this process) --------------------------------------------------------
@pytest.fixture()
def report_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINPILOT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    return tmp_path


@pytest.mark.parametrize("fmt", ["text", "template", "chat", "sharegpt", "alpaca", "preference", "kto",
                                 "prompt_response"])
def test_each_format_is_previewed_with_trained_and_masked_segments(report_env, fmt):
    from trainer.worker.probes.data_report import report

    path = write_jsonl(report_env / f"{fmt}.jsonl", SAMPLES[fmt], repeat=3)
    extra = {"prompt_template": "Q: {question}\nA: ", "response_template": "{answer}"} if fmt == "template" else {}
    cfg = RunConfig.model_validate({"model": {"source": "demo-tiny-llama"},
                                    "data": {"path": str(path), "seq_len": 24, **extra}})
    r = report(cfg, examples=2)
    assert r["format"] == fmt and r["records"] == 3 * len(SAMPLES[fmt])
    t = r["tokens"]
    assert 0 < t["median"] <= t["p95"] <= t["max"] and 0.0 <= t["truncated_fraction"] <= 1.0
    assert sum(r["histogram"]["counts"]) == r["records"]
    assert len(r["examples"]) == 2
    for ex in r["examples"]:
        kinds = {s["trained"] for s in ex["segments"]}
        assert True in kinds and all(isinstance(s["text"], str) and s["text"] for s in ex["segments"])
        if fmt != "text":
            assert False in kinds, "something is masked"
        # every example says its token count, pairs too (the prompt with its longer answer, as the statistics)
        assert isinstance(ex["tokens"], int) and 0 < ex["tokens"] <= t["max"]
    if fmt in ("preference", "kto"):  # prompt and answer kept apart: the prompt is not inside the trained text
        ex = r["examples"][0]
        assert [s["trained"] for s in ex["segments"]] == [False, True]
        assert ("rejected" in ex) == (fmt == "preference") and ("label" in ex) == (fmt == "kto")
    if fmt in ("chat", "sharegpt", "alpaca", "prompt_response"):
        assert r["chat_template"] == "default"
        trained = "".join(s["text"] for s in r["examples"][0]["segments"] if s["trained"])
        masked = "".join(s["text"] for s in r["examples"][0]["segments"] if not s["trained"])
        assert "Near the river." in trained and "Where is the cat?" not in trained
        assert "<|assistant|>" in masked and "</s>" in trained
    if fmt == "chat":
        tokens = report(cfg.model_copy(update={"data": cfg.data.model_copy(update={"seq_len": 1000})}), 0)["tokens"]
        assert tokens["truncated_fraction"] == 0.0 and tokens["max"] == t["max"]


@pytest.mark.parametrize("names", formats.PAIR_NAMES[1:], ids="/".join)
def test_every_pair_naming_is_previewed_with_the_prompt_masked(report_env, names):
    from trainer.worker.probes.data_report import report

    rows = [{names[0]: f"Where is cat {i}?", names[1]: f"Near river {i}."} for i in range(6)]
    cfg = RunConfig.model_validate({"model": {"source": "demo-tiny-llama"},
                                    "data": {"path": str(write_jsonl(report_env / "pairs.jsonl", rows)), "seq_len": 64}})
    r = report(cfg, examples=1)
    segments = r["examples"][0]["segments"]
    trained = "".join(s["text"] for s in segments if s["trained"])
    masked = "".join(s["text"] for s in segments if not s["trained"])
    assert r["format"] == "prompt_response" and "Near river 0." in trained and "Where is cat 0?" in masked
    assert "Where is cat" not in trained and 0 < r["tokens"]["trained"] < r["tokens"]["per_epoch"]


def test_prompt_completion_is_previewed_as_it_is_trained(report_env):
    from trainer.worker.probes.data_report import report

    rows = [{"prompt": f"Where is cat {i}?", "completion": f" Near river {i}."} for i in range(6)]
    cfg = RunConfig.model_validate({"model": {"source": "demo-tiny-llama"},
                                    "data": {"path": str(write_jsonl(report_env / "pc.jsonl", rows)), "seq_len": 64}})
    segments = report(cfg, examples=1)["examples"][0]["segments"]
    assert [(s["text"], s["trained"]) for s in segments] == [("Where is cat 0?", False), (" Near river 0.</s>", True)]


@pytest.mark.slow  # a child process or a model load: seconds (pytest -m 'not slow' stays under 4 min)
def test_local_dataset_folder_stands_in_for_a_hub_id(report_env):
    from trainer.worker.probes.data_report import report

    folder = report_env / "my-hub-dataset"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", SAMPLES["sharegpt"], repeat=5)
    cfg = RunConfig.model_validate({"model": {"source": "demo-tiny-llama"},
                                    "data": {"hub_dataset": str(folder), "hub_split": "train", "seq_len": 64}})
    r = report(cfg, examples=1)
    assert (r["format"], r["records"], r["source"]) == ("sharegpt", 5, str(folder))


# -- the command, and bad input through it (child processes) -----------------------------------------------
def cli(ws: Path, *args, env: dict | None = None, timeout: float = PREFLIGHT_TIMEOUT):
    import os
    import subprocess

    caches = ws.parent / f"{ws.name}-caches"  # outside the workspace, whose bytes a refused command must not change
    full = dict(os.environ, TRAINPILOT_CACHE=str(caches / "tp"), HF_DATASETS_CACHE=str(caches / "hf"), **(env or {}))
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, cwd=REPO, env=full, timeout=timeout)


@pytest.mark.slow  # a child process or a model load: seconds (pytest -m 'not slow' stays under 4 min)
def test_data_command_json_contract(tmp_path):
    """Also: the shipped demo model asks the hub nothing (a text model's processor lookup once waited ~47 s for
    huggingface_hub's retries on a machine without a network, on every data report and training run)."""
    write_jsonl(tmp_path / "train.jsonl", [CHAT, TOOL_CHAT], repeat=4)
    cfg = write_workspace_config(tmp_path, {"data.seq_len": 40})
    hub = FakeHub({})
    try:
        proc = cli(tmp_path, "data", cfg, "--json", "--examples", "3", timeout=300, env={"HF_ENDPOINT": hub.start()})
    finally:
        hub.stop()
    assert proc.returncode == 0, proc.stderr
    assert hub.requests == [], "the demo model is shipped: nothing is asked of the hub"
    r = json.loads(proc.stdout)
    assert r["format"] == "chat" and r["records"] == 8 and isinstance(r["records"], int)
    assert set(r["tokens"]) >= {"median", "p95", "max", "truncated_fraction"}
    assert r["tokens"]["truncated_fraction"] > 0, "some conversations are longer than 40 tokens"
    assert len(r["examples"]) == 3
    from transformers import PreTrainedTokenizerFast  # noqa: F401  (the test may import it; the GUI may not)

    text = "".join(s["text"] for s in r["examples"][1]["segments"])
    assert text.startswith("<s><|user|>\nLook it up.</s>\n<|assistant|>\n") and "<|tool|>\nasleep</s>" in text
    proc = cli(tmp_path, "data", cfg, "--examples", "1", timeout=300)
    assert proc.returncode == 0 and "format:   chat" in proc.stdout and "[<s><|system|>" in proc.stdout
    # --early-examples: the same examples on a line of their own, before the report (the Data page shows them while
    # every record is tokenized: walkthrough 7)
    proc = cli(tmp_path, "data", cfg, "--json", "--examples", "3", "--early-examples", timeout=300)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) == 2, proc.stdout
    assert json.loads(lines[0]) == {"early_examples": r["examples"]} and json.loads(lines[1]) == r


BAD = {
    "no_assistant_turn": ({"messages": [{"role": "user", "content": "Hi"}]}, ("line 2", "field 'messages'", "no assistant turn")),
    "empty_messages": ({"messages": []}, ("line 2", "field 'messages'", "empty")),
    "turn_without_role": ({"messages": [{"content": "Hi"}]}, ("line 2", "field 'messages[0]'", "'role'")),
    "alpaca_output_missing": ({"instruction": "x", "output": 3}, ("line 2", "field 'output'", "must be text")),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_records_exit_2_naming_file_line_field_and_nothing_is_written(tmp_path, case):
    record, needles = BAD[case]
    good = CHAT if "messages" in record else ALPACA
    (tmp_path / "train.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(record) + "\n")
    cfg = write_workspace_config(tmp_path)
    before = tree_digest(tmp_path)
    for args in (("run", cfg), ("data", cfg)):
        proc = cli(tmp_path, *args)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and "train.jsonl" in proc.stderr
        for needle in needles:
            assert needle in proc.stderr, (needle, proc.stderr)
    assert not (tmp_path / "runs").exists()
    assert tree_digest(tmp_path) == before


def test_unknown_record_format_and_untrainable_pairs_exit_2(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [PREFERENCE])
    proc = cli(tmp_path, "run", write_workspace_config(tmp_path, {"data.record_format": "openai"}))
    assert proc.returncode == 2 and "data.record_format" in proc.stderr and "sharegpt" in proc.stderr
    proc = cli(tmp_path, "run", write_workspace_config(tmp_path))
    assert proc.returncode == 2 and "preference records" in proc.stderr and "training.objective: dpo" in proc.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow  # a child process or a model load: seconds (pytest -m 'not slow' stays under 4 min)
def test_role_the_template_rejects_exits_2_through_the_data_command(tmp_path):
    from trainer.worker.datapipe.tokenizer import train_bpe

    tok = tmp_path / "tok"
    train_bpe(["Where is the cat? Near the river."] * 10, tok, 300)
    config = json.loads((tok / "tokenizer_config.json").read_text())
    config["chat_template"] = ("{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
                               "{{ raise_exception('Conversation roles must be user or assistant') }}{% endif %}"
                               "[{{ m['role'] }}] {{ m['content'] }}{{ eos_token }}{% endfor %}")
    (tok / "tokenizer_config.json").write_text(json.dumps(config))
    write_jsonl(tmp_path / "train.jsonl", [SAMPLES["chat"][0]])  # it has a system message
    cfg = write_workspace_config(tmp_path, {"model.tokenizer": str(tok), "data.system_message": "error"})
    proc = cli(tmp_path, "data", cfg, timeout=300)
    assert proc.returncode == 2, proc.stderr
    for needle in ("train.jsonl line 1", "field 'messages'", "no system role", "data.system_message", "'merge'"):
        assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    write_jsonl(tmp_path / "train.jsonl", [{"messages": [{"role": "user", "content": "Where is the cat?"},
                                                         {"role": "tool", "content": "Near the river."},
                                                         {"role": "assistant", "content": "Near the river."}]}])
    proc = cli(tmp_path, "data", write_workspace_config(tmp_path, {"model.tokenizer": str(tok)}), timeout=300)
    assert proc.returncode == 2, proc.stderr
    for needle in ("train.jsonl line 1", "field 'messages'", "roles must be user or assistant", "data.chat_template"):
        assert needle in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow  # a child process or a model load: seconds (pytest -m 'not slow' stays under 4 min)
def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: connecting is refused, as a machine without a network sees it


@pytest.mark.slow  # child processes
def test_an_unreachable_hub_is_known_after_one_attempt_not_after_retries(tmp_path):
    """Issue 29 item 7: the Data page waited 40–90 s ("Tokenizing…") for huggingface_hub's retries before a cut
    error. Nothing sets offline mode here: the hub (HF_ENDPOINT) merely refuses connections."""
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}", "HF_HOME": str(tmp_path / ".hf-home")}
    write_jsonl(tmp_path / "train.jsonl", [PAIR])
    proc = cli(tmp_path, "data", write_workspace_config(tmp_path, {"model.source": "someone/not-downloaded-model"}), env=env)
    assert proc.returncode == 2 and "Retrying" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "someone/not-downloaded-model is not downloaded and the hub cannot be reached" in proc.stderr
    assert "Download" in proc.stderr and "Traceback" not in proc.stderr
    cfg = write_workspace_config(tmp_path, {"data.hub_dataset": "someone/not-cached-anywhere", "data.path": "demo"})
    proc = cli(tmp_path, "data", cfg, env=env, timeout=300)
    assert proc.returncode == 2 and "offline" in proc.stderr and "Retrying" not in proc.stderr, proc.stderr


@pytest.mark.slow  # measured >= 3.5 s on the 2-core machine
def test_uncached_hub_dataset_offline_exits_2_with_one_message(tmp_path):
    cfg = write_workspace_config(tmp_path, {"data.hub_dataset": "someone/not-cached-anywhere", "data.path": "demo"})
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / ".hf-home")}
    before = tree_digest(tmp_path)
    for command in ("data", "run"):
        proc = cli(tmp_path, command, cfg, env=env, timeout=300)
        assert proc.returncode == 2, proc.stderr
        assert "data.hub_dataset" in proc.stderr and "someone/not-cached-anywhere" in proc.stderr
        assert "offline" in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    assert tree_digest(tmp_path) == before and not (tmp_path / "runs").exists()


def test_the_configs_record_formats_are_the_formats_the_data_room_reads_and_describes():
    """The config's ``data.record_format`` choices are spelled in the schema (the config room cannot import the data
    room); this ties them: every choice but ``auto`` is a format ``formats`` trains or previews and describes, and
    every such format is a choice."""
    from typing import get_args
    choices = set(get_args(RunConfig.model_fields["data"].annotation.model_fields["record_format"].annotation))
    assert choices - {"auto"} == set(formats.TRAINABLE_FORMATS) | set(formats.PAIR_FORMATS)
    assert all(formats.describe(f) for f in choices - {"auto"})
