"""The tokenizer a run trains with is the model's own (trainer/worker/datapipe/tokenizer.py ``load_pretrained``), and
the run and ``trainpilot-cli data`` say whether it agrees with the model's tokenizer.model
(trainer/worker/loading/tokenizer_check.py).

transformers 5's ``LlamaTokenizer`` rebuilds a Metaspace pre-tokenizer over the Llama 2 tokenizer.json it is given:
on llama.cpp's own test strings of Llama 2's vocabulary it read 32 of 47 as SentencePiece does (text after a special
token lost its "▁", a leading space was dropped). The families are tests/real_models.py's, whose tokenizer_config.json
names the hub repos' classes (``LlamaTokenizer`` for Llama 2 and Phi-3, ``GemmaTokenizer`` for Gemma 2).

A tokenizer.json that itself reads text unlike its tokenizer.model (Mistral v0.3's and Phi-3's style: no normalizer, a
Metaspace prepending "▁" only at the start) is read as SentencePiece reads text
(trainer/worker/loading/sentencepiece_reading.py): the run trains on that reading, says so at its start, and its GGUF
export verifies."""
from __future__ import annotations

import json
import shutil

import pytest

import real_models as rm
from helpers_train import cli, events, tiny_config, write_config

SENTENCEPIECE = {"llama-2": "llama-spm", "phi-3.5": "phi-3"}  # family -> llama.cpp vocab of its test strings
FIRST_ONLY = {"mistral-v0.3-style": "llama-2", "phi-3-style": "phi-3.5"}  # tokenizer.json style -> family of its vocab


def _cfg(source, **data):
    from trainer.config.sections import RunConfig

    return RunConfig.model_validate({"model": {"source": str(source)}, "data": {"path": "x.jsonl", **data}})


def _first_only(folder, family: str, drop_merge: str | None = None):
    """A copy of ``family``'s model whose tokenizer.json has Mistral v0.3's and Phi-3's pipeline (no normalizer, a
    Metaspace that prepends "▁" only at the start of the text: what transformers writes for legacy=False) beside
    the SentencePiece tokenizer.model; ``drop_merge`` also removes that merge (a vocabulary unlike tokenizer.model's)."""
    shutil.copytree(rm.family_dir(family), folder)
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    spec["normalizer"] = None
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
    if drop_merge:
        merges = spec["model"]["merges"]
        spec["model"]["merges"] = [m for m in merges if (m if isinstance(m, str) else " ".join(m)) != drop_merge]
        assert len(spec["model"]["merges"]) == len(merges) - 1
    (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    return folder


@pytest.mark.parametrize("name", sorted(SENTENCEPIECE))
def test_the_run_tokenizer_reads_llama_cpp_test_strings_as_sentencepiece_does(name):
    import sentencepiece as spm

    from trainer.worker.loading import modeling

    folder = rm.family_dir(name)
    tok = modeling.load_tokenizer(_cfg(folder))  # what the run, the data report and generation load
    vectors = rm.test_vectors(SENTENCEPIECE[name])
    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    ours = [tok(text, add_special_tokens=False)["input_ids"] for text, _ in vectors]
    assert len(vectors) == 47
    assert sum(ids == want for ids, (_, want) in zip(ours, vectors)) == 47, "llama.cpp's expected ids"
    assert sum(ids == sp.encode(text) for ids, (text, _) in zip(ours, vectors)) == 47, "sentencepiece itself"
    marker = "<s>[INST]" if name == "llama-2" else "<|user|>\nHi"
    want = [tok.bos_token_id, sp.piece_to_id("▁[")] if name == "llama-2" else [32010, *sp.encode("\nHi")]
    assert tok(marker, add_special_tokens=False)["input_ids"][:len(want)] == want, "a prefix space after a special"


@pytest.mark.parametrize("name", ["llama-2", "phi-3.5", "gemma-2", "mistral-nemo"])
def test_the_check_agrees_for_the_shipped_sentencepiece_tokenizers(name):
    from trainer.worker.loading import modeling, tokenizer_check

    cfg = _cfg(rm.family_dir(name))
    checked = tokenizer_check.report(modeling.load_tokenizer(cfg), cfg)
    assert checked["status"] == "agrees", checked
    assert checked["probes"] >= 20 and checked["reference"].endswith("tokenizer.model")
    assert checked["message"].startswith("the tokenizer agrees with the model's tokenizer.model")
    assert checked["reading"] == "tokenizer.json" and tokenizer_check.warning_events(checked) == []


@pytest.mark.parametrize("style", sorted(FIRST_ONLY))
def test_a_tokenizer_json_that_reads_unlike_tokenizer_model_is_read_as_sentencepiece(tmp_path, style):
    """The shipped tokenizer.json differs from tokenizer.model on the probes; the run's tokenizer reads as
    SentencePiece and llama.cpp do (47 of 47 of llama.cpp's test strings, text after a special token), keeps
    the offsets the data pipeline labels tokens by, decodes back, and saves that reading (final/, checkpoints)."""
    import sentencepiece as spm

    from trainer.worker.datapipe.tokenizer import load_pretrained
    from trainer.worker.loading import modeling, tokenizer_check

    family = FIRST_ONLY[style]
    folder = _first_only(tmp_path / "model", family)
    cfg = _cfg(folder)
    as_shipped = tokenizer_check.check(load_pretrained(folder), str(folder))
    assert as_shipped.status == "differs" and as_shipped.differing > 0, "the style really reads otherwise"
    tok = modeling.load_tokenizer(cfg)
    checked = tokenizer_check.report(tok, cfg)
    assert checked["status"] == "agrees" and checked["reading"] == "sentencepiece", checked
    assert checked["shipped"]["differing"] == as_shipped.differing and checked["shipped"]["probes"] == checked["probes"]
    assert "the shipped tokenizer.json reads" in checked["message"]
    [(code, message)] = tokenizer_check.warning_events(checked)
    assert code == "tokenizer_sentencepiece"
    assert message.startswith(f"the shipped tokenizer.json reads {as_shipped.differing} of {checked['probes']} probe "
                              f"texts unlike tokenizer.model") and "training uses SentencePiece's reading" in message

    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    vectors = rm.test_vectors(SENTENCEPIECE[family])
    assert [tok(t, add_special_tokens=False)["input_ids"] for t, _ in vectors] == [want for _, want in vectors]
    marker = "<s>[INST]" if family == "llama-2" else "<|user|>\nHi"
    want = [tok.bos_token_id, sp.piece_to_id("▁[")] if family == "llama-2" else [32010, *sp.encode("\nHi")]
    assert tok(marker, add_special_tokens=False)["input_ids"][:len(want)] == want, "a prefix space after a special"
    text = "Hi there\n  two spaces, naïve 🙂"
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert len(enc["offset_mapping"]) == len(enc["input_ids"]) and enc["offset_mapping"][-1][1] == len(text)
    assert tok.decode(enc["input_ids"]) == text

    saved = tmp_path / "final"
    tok.save_pretrained(str(saved))
    assert (saved / "tokenizer.model").read_bytes() == (folder / "tokenizer.model").read_bytes()
    again = modeling.load_tokenizer(cfg, saved)  # chat, Try it and the export load final/ so
    texts = [t for t, _ in vectors] + [marker]
    assert [again(t)["input_ids"] for t in texts] == [tok(t)["input_ids"] for t in texts]
    assert tokenizer_check.check(again, str(folder)).status == "agrees"


def test_a_rebuilt_reading_that_still_differs_is_not_used_and_the_run_is_warned(tmp_path):
    """tokenizer.json's own vocabulary unlike tokenizer.model's (a merge missing): SentencePiece's reading over it
    differs too, so the shipped tokenizer.json stays, and the check says both."""
    from trainer.worker.loading import modeling, tokenizer_check

    folder = _first_only(tmp_path / "model", "llama-2", drop_merge="▁H ello")
    cfg = _cfg(folder)
    checked = tokenizer_check.report(modeling.load_tokenizer(cfg), cfg)
    assert checked["status"] == "differs" and checked["reading"] == "tokenizer.json", checked
    assert 0 < checked["rebuilt"]["differing"] < checked["differing"]
    [(code, message)] = tokenizer_check.warning_events(checked)
    assert code == "tokenizer_differs" and "a GGUF export will not verify" in message
    assert "read as tokenizer.model describes differs too" in message


def test_the_check_names_what_a_rebuilt_tokenizer_reads_differently():
    """transformers' own LlamaTokenizer over Llama 2's files (what ``AutoTokenizer`` gives): the check says it
    differs, and where."""
    from transformers import AutoTokenizer

    from trainer.worker.datapipe.tokenizer import keep_sentencepiece_model
    from trainer.worker.loading import tokenizer_check

    folder = rm.family_dir("llama-2")
    rebuilt = AutoTokenizer.from_pretrained(str(folder))
    assert type(rebuilt).__name__ == "LlamaTokenizer"
    keep_sentencepiece_model(rebuilt, folder / "tokenizer.model")
    result = tokenizer_check.check(rebuilt, str(folder))
    assert result.status == "differs" and 0 < result.differing < result.probes
    assert result.example == {"text": " Hello", "training": ["▁Hello"], "reference": ["▁", "▁Hello"]}
    assert "a GGUF export will not verify" in result.message()
    assert tokenizer_check.warning_events(result.as_dict())[0][0] == "tokenizer_differs"


def test_a_tokenizer_without_tokenizer_model_is_not_checked_and_says_why():
    from trainer.worker.loading import modeling, tokenizer_check

    bpe = _cfg(rm.family_dir("qwen2.5"))
    checked = tokenizer_check.report(modeling.load_tokenizer(bpe), bpe)
    assert checked["status"] == "not_checked" and "ships no tokenizer.model" in checked["message"]
    demo = _cfg("demo-tiny-llama", path="demo")
    checked = tokenizer_check.report(modeling.load_tokenizer(demo), demo)
    assert checked["status"] == "not_checked" and "trained by TrainPilot" in checked["message"]


@pytest.mark.parametrize("name", ["qwen2.5", "llama-3.2", "deepseek-r1-distill"])
def test_byte_level_tokenizers_load_as_transformers_loads_them(name):
    """Where the class transformers picks loads tokenizer.json as written, the loader changes nothing."""
    from transformers import AutoTokenizer

    from trainer.worker.datapipe.tokenizer import load_pretrained

    folder = rm.family_dir(name)
    auto, ours = AutoTokenizer.from_pretrained(str(folder)), load_pretrained(folder)
    texts = [t for t, _ in rm.test_vectors("qwen2" if "q" in name or "deepseek" in name else "llama-bpe")]
    assert [ours(t)["input_ids"] for t in texts] == [auto(t)["input_ids"] for t in texts]


def test_saved_tokenizers_keep_tokenizer_model_and_read_the_same(tmp_path):
    """``final/``, each checkpoint and the data producers' copy are ``save_pretrained`` of the run's tokenizer: they
    carry tokenizer.model (llama.cpp's converter reads a SentencePiece vocabulary from it) and load back equal."""
    from trainer.worker.datapipe.tokenizer import load_pretrained

    folder = rm.family_dir("llama-2")
    tok = load_pretrained(folder)
    saved = tok.save_pretrained(str(tmp_path / "final"))
    assert str(tmp_path / "final" / "tokenizer.model") in saved
    assert (tmp_path / "final" / "tokenizer.model").read_bytes() == (folder / "tokenizer.model").read_bytes()
    again = load_pretrained(tmp_path / "final")
    texts = [t for t, _ in rm.test_vectors("llama-spm")] + ["<s>[INST] Hi [/INST]"]
    assert [again(t)["input_ids"] for t in texts] == [tok(t)["input_ids"] for t in texts]


@pytest.mark.slow
def test_data_report_says_whether_the_tokenizer_agrees(tmp_path):
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Hi {i}"},
                                                     {"role": "assistant", "content": "Hello."}]}) + "\n"
                            for i in range(4)), encoding="utf-8")
    env = {"TRAINPILOT_CACHE": str(tmp_path / "cache"), "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    config = write_config(tmp_path / "c.yaml", tiny_config(model={"source": str(rm.family_dir("llama-2"))},
                                                            data={"path": str(data), "seq_len": 64}))
    proc = cli("data", config, "--json", "--examples", "1", env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["tokenizer"]["status"] == "agrees", report["tokenizer"]
    text = cli("data", config, "--examples", "0", env=env)
    assert "tokenizer: the tokenizer agrees with the model's tokenizer.model (SentencePiece) on all" in text.stdout


@pytest.mark.slow
@pytest.mark.parametrize("style", sorted(FIRST_ONLY))
def test_a_run_trains_on_sentencepieces_reading_says_so_and_its_gguf_export_verifies(tmp_path, style):
    """Mistral v0.3's and Phi-3's tokenizer.json style beside a SentencePiece tokenizer.model (the walkthrough's
    "15 of 26 probe texts", then an export refused: "'▁[' (518) where training has '[' (29961)"): the run trains on
    SentencePiece's reading, says so in its first lines, and ``export-model --gguf`` verifies in llama.cpp."""
    import importlib.util

    from helpers_family import RECORDS

    model = _first_only(tmp_path / "model", FIRST_ONLY[style])
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS), encoding="utf-8")
    config = write_config(tmp_path / "c.yaml", tiny_config(model={"source": str(model)},
                                                            data={"path": str(data), "seq_len": 256},
                                                            training={"max_steps": 1, "effective_batch_size": 2,
                                                                      "micro_batch_size": 2,
                                                                      "gradient_accumulation_steps": 1},
                                                            checkpoints={"every_steps": 10}))
    env = {"TRAINPILOT_CACHE": str(tmp_path / "cache"), "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    proc = cli("run", config, "--run-dir", tmp_path / "run", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    started = events(tmp_path / "run", "run_started")[0]
    assert started["tokenizer"]["reading"] == "sentencepiece", started["tokenizer"]
    assert started["tokenizer"]["status"] == "agrees" and started["tokenizer"]["shipped"]["differing"] > 0
    warned = {e["code"]: e["message"] for e in events(tmp_path / "run", "warning")}
    assert "tokenizer_differs" not in warned and "training uses SentencePiece's reading" in warned["tokenizer_sentencepiece"]
    log = (tmp_path / "run" / "train.log").read_text(encoding="utf-8")
    assert "trainpilot: the shipped tokenizer.json reads" in log
    final = tmp_path / "run" / "final"
    assert (final / "tokenizer.model").is_file()
    saved = json.loads((final / "tokenizer.json").read_text(encoding="utf-8"))
    assert saved["pre_tokenizer"] is None and {"type": "Prepend", "prepend": "▁"} in saved["normalizer"]["normalizers"]

    proc = cli("export-model", tmp_path / "run", "--to", tmp_path / "out", "--gguf", "f16", env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    verification = json.loads((tmp_path / "out" / "verification.json").read_text(encoding="utf-8"))
    if importlib.util.find_spec("llama_cpp") is None:
        assert verification["verified"] is None and "pip install" in verification["summary"]
        rm.missing("llama-cpp-python is not installed: the export was written and says 'not verified'")
    assert verification["verified"] is True, verification
    assert verification["summary"].startswith("verified in llama.cpp: prompt ids equal"), verification["summary"]
