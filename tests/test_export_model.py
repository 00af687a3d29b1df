"""``trainpilot-cli export-model``: merged weights equal the adapter model, GGUF files (written by
llama.cpp's own convert_hf_to_gguf.py) load back through transformers with matching logits and carry
the tokenizer and chat template; Ollama Modelfile; refusals that leave nothing behind.
(llama.cpp itself runs the exports of trained families in tests/test_family_training.py.)

Tolerances. The conversion is checked exactly: logits of the model read back from the GGUF equal
(max abs diff <= 1e-5, fp32) those of the merged model whose 2-D weights went through the same
storage (f16 rounding, or gguf's own Q8_0 quantize/dequantize). Against the fp32 merged
model the storage error shows: f16 keeps 11 significant bits (relative rounding <= 2^-11 per
weight) and Q8_0 one f16 scale per 32 values with 8-bit steps (<= 2^-8 of the block's largest
weight). Through two layers of a tiny random model those errors stay within a few units of that
relative size of the largest logit; we allow 4 × 2^-11 (f16) and 4 × 2^-8 (Q8_0) of max |logit|.
"""
from __future__ import annotations

import json
import shutil

import pytest
from helpers_train import cli, trained_runs
from shared_once import shared_once

IDS = [[1, 50, 60, 70, 300, 5, 9, 41]]


@pytest.fixture(scope="module")
def runs():
    return trained_runs()


@pytest.fixture(scope="module")
def exported(runs):
    """The LoRA run exported twice, once per session (both xdist workers read the same files; tests only read
    them): f16 GGUF with a Modelfile, and q8_0."""
    kinds = (("f16", ["--ollama"]), ("q8_0", []))

    def build(root):
        for kind, extra in kinds:
            proc = cli("export-model", runs["lora"], "--to", root / kind, "--gguf", kind, *extra)
            assert proc.returncode == 0, proc.stderr

    root = shared_once("lora-exports", build)
    return {kind: root / kind for kind, _ in kinds}


def _logits(model):
    import torch

    with torch.no_grad():
        return model(torch.tensor(IDS)).logits.float()


def _stored_like(model, kind: str):
    """A copy of ``model`` whose 2-D weights went through the GGUF storage of ``kind``."""
    import copy

    import gguf
    import numpy as np
    import torch

    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            if p.dim() != 2:
                continue
            w = p.detach().float().numpy()
            if kind == "q8_0" and w.shape[-1] % 32 == 0:
                q = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
                w = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0).reshape(w.shape)
            else:
                w = w.astype(np.float16).astype(np.float32)
            p.copy_(torch.from_numpy(np.ascontiguousarray(w)))
    return twin


def _gguf_alone(folder, kind, tmp_path):
    """The GGUF file copied into a folder of its own (so nothing but the GGUF describes the model)."""
    solo = tmp_path / f"solo-{kind}"
    solo.mkdir()
    shutil.copy(folder / f"model-{kind}.gguf", solo)
    return solo, f"model-{kind}.gguf"


@pytest.mark.slow
def test_merged_logits_equal_the_peft_model(runs):
    from trainer import config as config_mod
    from trainer.worker.generate import generation as chat
    from trainer.worker.export import model_export as export_model

    cfg = config_mod.load(runs["lora"] / "config.yaml")
    source = runs["lora"] / "final"
    peft_logits = _logits(chat.load_model(cfg, source))
    merged_logits = _logits(export_model.merged_model(cfg, source))
    base_logits = _logits(chat.load_model(cfg, source, base=True))
    assert (peft_logits - merged_logits).abs().max().item() <= 1e-5
    assert (peft_logits - base_logits).abs().max().item() > 1e-3, "the adapter must matter for this to mean anything"


@pytest.mark.parametrize("kind,loose", [("f16", 4 * 2 ** -11), ("q8_0", 4 * 2 ** -8)])
@pytest.mark.slow
def test_gguf_loads_back_through_transformers_with_matching_logits(exported, kind, loose, tmp_path):
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(str(exported[kind]), dtype="float32")
    solo, name = _gguf_alone(exported[kind], kind, tmp_path)
    back = AutoModelForCausalLM.from_pretrained(str(solo), gguf_file=name, dtype="float32")
    ref, got = _logits(merged), _logits(back)
    exact = (got - _logits(_stored_like(merged, kind))).abs().max().item()
    assert exact <= 1e-5, f"the writer changed more than the storage format: {exact}"
    err = (got - ref).abs().max().item()
    assert 0 < err <= loose * ref.abs().max().item(), (err, ref.abs().max().item())


@pytest.mark.slow
def test_gguf_metadata_holds_tokenizer_and_chat_template(exported, tmp_path):
    import gguf
    from transformers import AutoTokenizer

    folder = exported["f16"]
    reader = gguf.GGUFReader(str(folder / "model-f16.gguf"))
    field = lambda key: reader.fields[key].contents()  # noqa: E731
    template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    assert field("tokenizer.chat_template") == template and "### Question:" in template
    tokens = field("tokenizer.ggml.tokens")
    # the demo tokenizer is trained for the run: llama.cpp's hash list cannot know it; its split rule is GPT-2's
    assert field("tokenizer.ggml.model") == "gpt2" and field("tokenizer.ggml.pre") == "gpt-2"
    assert tokens[field("tokenizer.ggml.eos_token_id")] == "</s>" and tokens[field("tokenizer.ggml.bos_token_id")] == "<s>"
    assert field("tokenizer.ggml.token_type")[2] == gguf.TokenType.CONTROL
    tj = json.loads((folder / "tokenizer.json").read_text())
    assert len(field("tokenizer.ggml.merges")) == len(tj["model"]["merges"])
    solo, name = _gguf_alone(folder, "f16", tmp_path)
    from_gguf = AutoTokenizer.from_pretrained(str(solo), gguf_file=name)
    original = AutoTokenizer.from_pretrained(str(folder))
    text = "### Question:\nWhat is 7 plus 3?\n### Answer:\n7 plus 3 is 10.</s> héllo  world"
    assert from_gguf(text, add_special_tokens=False).input_ids == original(text, add_special_tokens=False).input_ids


@pytest.mark.slow
def test_export_folder_has_tokenizer_template_generation_config_and_modelfile(exported):
    folder = exported["f16"]
    gen = json.loads((folder / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 2 and gen["bos_token_id"] == 1 and json.loads((folder / "config.json").read_text())["use_cache"]
    assert not (folder / "adapter_config.json").exists() and (folder / "model.safetensors").is_file()
    modelfile = (folder / "Modelfile").read_text()
    assert "FROM ./model-f16.gguf" in modelfile
    assert ('{{ if eq .Role "user" }}### Question:\n{{ .Content }}\n### Answer:\n{{ $seen = true }}'
            '{{ else if eq .Role "assistant" }}{{ .Content }}</s>{{ end }}') in modelfile
    assert 'PARAMETER stop "</s>"' in modelfile and "PARAMETER temperature" in modelfile
    assert "PARAMETER num_ctx 512" in modelfile  # tiny-llama's max_position_embeddings, not data.seq_len (64)
    for path in folder.iterdir():  # readable by the user's other tools (Ollama's server runs as its own user)
        assert path.stat().st_mode & 0o044 == 0o044, path
    assert folder.stat().st_mode & 0o055 == 0o055 and not list(folder.parent.glob(".*partial*"))


@pytest.mark.slow
def test_refusals_exit_2_and_leave_files_alone(runs, tmp_path):
    proc = cli("export-model", runs["full"], "--to", tmp_path / "a", "--ollama")
    assert proc.returncode == 2 and "--gguf" in proc.stderr and "Traceback" not in proc.stderr
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "mine.txt").write_text("keep me")
    proc = cli("export-model", runs["full"], "--to", busy)
    assert proc.returncode == 2 and "already has files" in proc.stderr
    assert [p.name for p in busy.iterdir()] == ["mine.txt"] and (busy / "mine.txt").read_text() == "keep me"
    other = tmp_path / "toyrun"
    shutil.copytree(runs["full"], other)
    conf = json.loads((other / "final" / "config.json").read_text())
    (other / "final" / "config.json").write_text(json.dumps(dict(conf, architectures=["ToyNetForCausalLM"])))
    proc = cli("export-model", other, "--to", tmp_path / "g" / "out", "--gguf", "f16")
    assert proc.returncode == 2 and "does not know the architecture 'ToyNetForCausalLM'" in proc.stderr
    assert "export without --gguf" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "g").exists()  # not even the parent folder it would have made
    (other / "final" / "config.json").write_text(json.dumps(conf))  # the fix: a retry into the same folder works
    proc = cli("export-model", other, "--to", tmp_path / "g" / "out", "--gguf", "q8_0")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "g" / "out" / "model-q8_0.gguf").is_file() and not list((tmp_path / "g").glob(".*"))


@pytest.mark.slow
def test_the_demo_export_runs_in_llama_cpp_as_in_transformers(exported):
    """The run's own chat template and trained tokenizer, in llama.cpp itself (see test_family_training.py)."""
    from helpers_gguf import llama_cpp_report, stops_at_end_of_turn

    folder = exported["f16"]
    r = llama_cpp_report(folder, folder / "model-f16.gguf")
    assert r["tokens"] == r["tokens_of"] and r["chat"] == r["chat_of"], r
    assert r["max_logit_diff"] <= 1e-2 * r["max_abs_logit"] and r["near_tie_only"], r
    assert stops_at_end_of_turn(folder / "model-f16.gguf", 2)  # </s> ends the demo's answers


@pytest.mark.slow
def test_q4_k_m_is_quantized_by_llama_cpps_quantizer(runs, tmp_path):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (llama.cpp's quantizer) is not installed")
    import gguf
    from helpers_gguf import llama_model

    dest = tmp_path / "q4"
    proc = cli("export-model", runs["lora"], "--to", dest, "--gguf", "q4_k_m")
    assert proc.returncode == 0, proc.stderr
    assert "quantizing to Q4_K_M with llama.cpp (llama-cpp-python)" in proc.stderr
    reader = gguf.GGUFReader(str(dest / "model-q4_k_m.gguf"))
    assert reader.fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_Q4_K_M
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q4"] and not list(dest.glob("*f16*"))
    llm = llama_model(dest / "model-q4_k_m.gguf")
    assert llm.tokenize(b"What is 7 plus 3?", add_bos=False, special=True)
