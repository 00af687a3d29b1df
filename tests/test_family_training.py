"""End to end on the real families (tests/real_models.py), one training each: ``trainpilot-cli run`` trains a tiny
model of each family, with its real tokenizer and chat template, on chat data whose records share a system prompt
(Phi-3.5, Gemma 3 and the mixture-of-experts families as LoRA runs, the experts adapted); then ``trainpilot-cli
export-model --gguf f16 --ollama`` writes the GGUF and the Modelfile, and the export verifies itself in llama.cpp on
the run's own validation prompts. On that same export llama.cpp itself is compared with transformers
(``helpers_gguf.llama_cpp_report``: tokenizer test texts, logits, the chat formatter's render and ids), the
Modelfile's TEMPLATE is rendered by Go's own text/template, and for Qwen2.5 ``verify-export`` catches a swapped GGUF,
an edited TEMPLATE and a missing stop token. The runs and exports are trained and written once per session
(``helpers_family``) and shared with test_moe_multimodal.

Each family's figures go to ``$TRAINPILOT_FAMILIES_OUT`` (JSON lines) when set: ``benchmarks/families_table.py``
runs this file and prints docs/after-training.md's table. ``TRAINPILOT_FAMILIES_Q8=1`` also converts q8_0."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil

import pytest

import real_models as rm
from helpers_family import SYSTEM, family_env, family_export, family_run
from helpers_gguf import CHAT, TEXTS, go_render, llama_cpp_report, llama_model, stops_at_end_of_turn
from helpers_train import cli, events


def _record(family: str, result: dict) -> None:
    out = os.environ.get("TRAINPILOT_FAMILIES_OUT")
    if out:
        with open(out, "a", encoding="utf-8") as f:
            f.write(json.dumps({"family": family, **result}) + "\n")


def _ollama_equal_in_go(tok, out) -> int:
    """The conversations the Modelfile's TEMPLATE renders in Go's own text/template exactly as training does."""
    from trainer.worker.export import ollama, ollama_template

    shape = ollama.check(tok)
    bos = tok.bos_token if ollama.adds_bos(tok) else None
    body = (out / "Modelfile").read_text(encoding="utf-8").split('TEMPLATE """', 1)[1].split('"""', 1)[0]
    want = [tok.apply_chat_template(ollama_template.merged_system(c, shape), add_generation_prompt=True, tokenize=False)
            for c in CHAT]
    want = [w[len(bos):] if bos and w.startswith(bos) else w for w in want]
    return sum(a == b for a, b in zip(go_render([{"template": body, "cases": [{"messages": c} for c in CHAT]}])[0], want))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(rm.FAMILIES))
def test_every_family_trains_through_the_cli_and_its_export_verifies_itself(tmp_path, name):
    run_dir = family_run(name)
    env = family_env(run_dir.parent)
    steps = events(run_dir, "step")
    assert [e["step"] for e in steps] == [1, 2] and all(e["loss"] > 0 for e in steps)
    checked = events(run_dir, "run_started")[0]["tokenizer"]  # the training tokenizer against the model's files
    sentencepiece = (rm.family_dir(name) / "tokenizer.model").is_file()
    assert checked["status"] == ("agrees" if sentencepiece else "not_checked"), checked
    final = run_dir / "final"
    saved = json.loads((final / "tokenizer_config.json").read_text(encoding="utf-8"))
    template = saved.get("chat_template") or (final / "chat_template.jinja").read_text(encoding="utf-8")
    assert template == rm.template_text(name), "the model ships with the template it was trained with"
    if sentencepiece:  # SentencePiece: tokenizer.model kept on every path after a real run
        checkpoints = list((run_dir / "checkpoints").glob("checkpoint-*"))
        assert checkpoints and all((p / "tokenizer.model").is_file() for p in checkpoints + [final])

    out = family_export(name)
    verification = json.loads((out / "verification.json").read_text(encoding="utf-8"))
    modelfile = (out / "Modelfile").read_text(encoding="utf-8")
    assert f'SYSTEM """{SYSTEM}"""' in modelfile, "every record's system prompt is Ollama's default"
    if importlib.util.find_spec("llama_cpp") is None:
        assert verification["verified"] is None and "pip install" in verification["summary"]
        rm.missing("llama-cpp-python is not installed: the export was written and says 'not verified'")
    assert verification["verified"] is True, verification
    assert verification["summary"].startswith("verified in llama.cpp: prompt ids equal (3/3)"), verification["summary"]
    assert "Ollama template equal" in verification["summary"] and verification["cases"][0].startswith("validation")
    _compare_in_llama_cpp(name, out, verification)
    if name == "qwen2.5":
        _tampering_is_caught(tmp_path, out, env)


def _compare_in_llama_cpp(name: str, out, verification: dict) -> None:
    """llama.cpp itself against transformers on the export (the families table's columns)."""
    from trainer.worker.datapipe.tokenizer import load_pretrained

    tok = load_pretrained(out)
    llm = llama_model(out / "model-f16.gguf")  # loaded once for every comparison below
    # the metadata as llama.cpp reads it (gguf-py's GGUFReader takes 8-14 s over a 128k vocabulary, this ~0 s)
    assert llm.metadata["general.name"] == "t", "the run's name"
    assert not [k for k, v in llm.metadata.items() if ".partial" in v], "no staging folder's name in the GGUF"
    r = llama_cpp_report(out, out / "model-f16.gguf", llm=llm)
    if (out / "tokenizer.model").is_file():
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))
        r["sentencepiece"] = sum(llm.tokenize(t.encode(), add_bos=False, special=False) == sp.encode(t) for t in TEXTS)
    eot = verification["checks"]["stops"]["id"]
    r["stops"] = stops_at_end_of_turn(out / "model-f16.gguf", eot, llm=llm)
    r["ollama"], r["ollama_of"] = _ollama_equal_in_go(tok, out), len(CHAT)
    r["verification"] = verification["summary"]
    r["q8_0"] = _q8_0(out) if os.environ.get("TRAINPILOT_FAMILIES_Q8") else None
    _record(name, r)
    assert r["tokens"] == r["tokens_of"] or r.get("sentencepiece") == r["tokens_of"], r
    assert r["chat"] == r["chat_of"] and r["stops"], r
    assert r["max_logit_diff"] <= 1e-2 * r["max_abs_logit"] and r["near_tie_only"], r
    assert r["ollama"] == r["ollama_of"], r


def _q8_0(out) -> bool:
    from trainer.models import gguf_support
    from trainer.worker.export import gguf_convert

    path = out.parent / "model-q8_0.gguf"
    gguf_convert.convert(gguf_support.converter_dir(), out, path, "q8_0")
    llama_model(path)
    return True


def _verify(folder, env):
    proc = cli("verify-export", folder, env=env)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _tampering_is_caught(tmp_path, out, env) -> None:
    """verify-export names what differs (exit 4): another model's GGUF, an edited TEMPLATE, a missing stop."""
    cases = {"swapped": tmp_path / "swapped", "template": tmp_path / "template", "stop": tmp_path / "stop"}
    for folder in (tmp_path / "as-written", *cases.values()):  # the shared export itself is left as written
        shutil.copytree(out, folder)
    assert _verify(tmp_path / "as-written", env)[0] == 0
    # another model of the same vocabulary: Qwen3's trained GGUF (this session's qwen3 export) in place of Qwen2.5's
    shutil.copyfile(family_export("qwen3") / "model-f16.gguf", cases["swapped"] / "model-f16.gguf")
    mf = cases["template"] / "Modelfile"
    mf.write_text(mf.read_text(encoding="utf-8").replace("<|im_start|>assistant\n", "<|im_start|>assistant "),
                  encoding="utf-8")
    mf = cases["stop"] / "Modelfile"
    mf.write_text(mf.read_text(encoding="utf-8").replace('PARAMETER stop "<|im_end|>"\n', ""), encoding="utf-8")
    code, text = _verify(cases["swapped"], env)
    assert code == 4 and "the export differs from training" in text and "llama.cpp" in text, text
    code, text = _verify(cases["template"], env)
    assert code == 4 and "ollama: " in text and "the TEMPLATE renders" in text, text
    code, text = _verify(cases["stop"], env)
    assert code == 4 and "PARAMETER stop lacks '<|im_end|>'" in text, text
    result = json.loads((cases["stop"] / "verification.json").read_text(encoding="utf-8"))
    assert result["verified"] is False and result["checks"]["prompt"]["ok"] is True
