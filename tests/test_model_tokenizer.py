"""The tokenizer a run trains with is the model's own (trainer/worker/datapipe/tokenizer.py ``load_pretrained``), and
the run and ``trainpilot-cli data`` say whether it agrees with the model's tokenizer.model
(trainer/worker/loading/tokenizer_check.py).

transformers 5's ``LlamaTokenizer`` rebuilds a Metaspace pre-tokenizer over the Llama 2 tokenizer.json it is given:
on llama.cpp's own test strings of Llama 2's vocabulary it read 32 of 47 as SentencePiece does (text after a special
token lost its "▁", a leading space was dropped). The families are tests/real_models.py's, whose tokenizer_config.json
names the hub repos' classes (``LlamaTokenizer`` for Llama 2 and Phi-3, ``GemmaTokenizer`` for Gemma 2)."""
from __future__ import annotations

import json
import shutil

import pytest

import real_models as rm
from helpers_train import cli, events, tiny_config, write_config

SENTENCEPIECE = {"llama-2": "llama-spm", "phi-3.5": "phi-3"}  # family -> llama.cpp vocab of its test strings


def _cfg(source, **data):
    from trainer.config.sections import RunConfig

    return RunConfig.model_validate({"model": {"source": str(source)}, "data": {"path": "x.jsonl", **data}})


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
    assert tokenizer_check.warnings(result.as_dict())[0][0] == "tokenizer_differs"


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
def test_a_run_whose_tokenizer_json_differs_from_tokenizer_model_warns_at_start(tmp_path):
    """Mistral v0.3's tokenizer.json style (a Metaspace that prepends "▁" only at the start, no normalizer) beside a
    SentencePiece tokenizer.model: the run trains with the tokenizer.json as shipped and warns, at its start, that
    it differs from tokenizer.model (and what a GGUF export will do)."""
    model = tmp_path / "model"
    shutil.copytree(rm.family_dir("llama-2"), model)
    spec = json.loads((model / "tokenizer.json").read_text(encoding="utf-8"))
    spec["normalizer"] = None
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
    (model / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    config = write_config(tmp_path / "c.yaml", tiny_config(model={"source": str(model)},
                                                            training={"max_steps": 1, "effective_batch_size": 2,
                                                                      "micro_batch_size": 2,
                                                                      "gradient_accumulation_steps": 1},
                                                            checkpoints={"every_steps": 10}))
    env = {"TRAINPILOT_CACHE": str(tmp_path / "cache"), "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    proc = cli("run", config, "--run-dir", tmp_path / "run", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    started = events(tmp_path / "run", "run_started")[0]
    assert started["tokenizer"]["status"] == "differs", started["tokenizer"]  # LlamaTokenizer builds this very pipeline
    assert started["tokenizer"]["example"]["reference"][:1] == ["▁"], "SentencePiece keeps the leading space"
    warned = [e for e in events(tmp_path / "run", "warning") if e["code"] == "tokenizer_differs"]
    assert len(warned) == 1 and "a GGUF export will not verify" in warned[0]["message"]
    assert (tmp_path / "run" / "final" / "tokenizer.model").is_file()
