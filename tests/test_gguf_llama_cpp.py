"""llama.cpp itself (llama-cpp-python 0.3.36, built from source) runs what export-model writes, for the
real tokenizer and chat template of every popular family (tests/real_models.py: tiny random-weight
models): the merged folder loads in plain transformers with no missing or unexpected weights; the f16
GGUF (llama.cpp's own converter) tokenizes every test text to the same ids as the HF tokenizer (as
SentencePiece itself, for SentencePiece vocabularies), gives the logits and greedy tokens of the
merged safetensors in transformers (weights rounded to f16 as stored), renders and tokenizes chat
prompts as training did (``create_chat_completion``'s own Jinja formatter over the GGUF's template)
and stops at the end of turn; the Modelfile's TEMPLATE renders in Go as the Jinja template does.

Each family's figures go to ``$TRAINPILOT_FAMILIES_OUT`` (JSON lines) when set:
``benchmarks/families_table.py`` runs this file and prints docs/after-training.md's table from them.
``TRAINPILOT_FAMILIES_Q8=1`` also converts to q8_0 (the table's column; off in CI to save time).

Tolerances: f16 storage keeps 11 significant bits, and llama.cpp computes in f32 with f16 weights, so
its logits match transformers' (the same f16-rounded weights in fp32) to ~1e-3 of the largest logit;
we allow 1e-2. Greedy tokens must agree until the first step whose top-two logit gap is below 2% of the
largest logit (a near tie either side may break), and every difference must be such a near tie.
"""
from __future__ import annotations

import json
import os
import shutil

import pytest
from helpers_gguf import (FAMILY_TEMPLATES, TEXTS, go_render, llama_cpp_report, llama_model, require_llama_cpp,
                          stops_at_end_of_turn)

pytestmark = pytest.mark.slow


def _record(family: str, result: dict) -> None:
    out = os.environ.get("TRAINPILOT_FAMILIES_OUT")
    if out:
        with open(out, "a", encoding="utf-8") as f:
            f.write(json.dumps({"family": family, **result}) + "\n")


def _export(family: str, folder, to):
    """export-model's writing step (``write_export``) on the family's model, as after training."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.worker.export import model_export

    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    files = model_export.write_export(model, tok, to, name=family, gguf_type="f16", ollama=True,
                                      progress=model_export.Progress(False, 5))
    return tok, files


def _sentencepiece_agrees(folder, gguf) -> int | None:
    """Texts llama.cpp tokenizes as SentencePiece itself does (None: not a SentencePiece vocabulary)."""
    if not (folder / "tokenizer.model").is_file():
        return None
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    llm = llama_model(gguf)
    return sum(llm.tokenize(t.encode(), add_bos=False, special=False) == sp.encode(t) for t in TEXTS)


def _ollama_equal(tok, out) -> int | None:
    """Conversations the Modelfile's TEMPLATE renders in Go exactly as the Jinja template (None: no Go)."""
    from helpers_gguf import CHAT

    from trainer.worker.export import ollama, ollama_template

    if shutil.which("go") is None and not os.environ.get("CI"):
        return None  # without Go the TEMPLATE is checked by the product's own renderer (test_gotemplate.py); CI has Go
    shape = ollama.check(tok)
    bos = tok.bos_token if ollama.adds_bos(tok) else None
    body = (out / "Modelfile").read_text(encoding="utf-8").split('TEMPLATE """', 1)[1].split('"""', 1)[0]
    want = [tok.apply_chat_template(ollama_template.merged_system(c, shape), add_generation_prompt=True, tokenize=False)
            for c in CHAT]
    want = [w[len(bos):] if bos and w.startswith(bos) else w for w in want]
    return sum(a == b for a, b in zip(go_render([{"template": body, "cases": [{"messages": c} for c in CHAT]}])[0], want))


@pytest.mark.parametrize("family", list(FAMILY_TEMPLATES))
def test_family_export_runs_in_llama_cpp_as_in_transformers(family, tmp_path):
    real_models = pytest.importorskip("real_models", reason="tests/real_models.py builds the families' models")
    from transformers import AutoModelForCausalLM

    from trainer.worker.export import model_export

    require_llama_cpp()
    folder = real_models.family_dir(family)
    out = tmp_path / "export"
    tok, files = _export(family, folder, out)
    merged, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True, dtype="float32")
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    gguf = out / "model-f16.gguf"
    r = llama_cpp_report(out, gguf, merged)
    r["sentencepiece"] = _sentencepiece_agrees(out, gguf)
    r["stops"] = stops_at_end_of_turn(gguf, model_export.end_of_turn_id(tok))
    r["ollama"], r["ollama_of"] = _ollama_equal(tok, out), 3
    r["q8_0"] = _q8_0(out) if os.environ.get("TRAINPILOT_FAMILIES_Q8") else None
    _record(family, r)
    assert r["tokens"] == r["tokens_of"] or r["sentencepiece"] == r["tokens_of"], r
    assert r["chat"] == r["chat_of"] and r["stops"], r
    assert r["max_logit_diff"] <= 1e-2 * r["max_abs_logit"] and r["near_tie_only"], r
    assert r["ollama"] in (None, r["ollama_of"]), r


def _q8_0(out) -> bool:
    from trainer.models import gguf_support
    from trainer.worker.export import gguf_convert

    path = out / "model-q8_0.gguf"
    gguf_convert.convert(gguf_support.converter_dir(), out, path, "q8_0")
    llama_model(path)
    return True
