"""Exports are all or nothing (written beside the destination, moved into place at the end), readable by
the user's other tools, and every GGUF refusal (no converter, an architecture it does not know, no
Q4_K_M quantizer) is decided before anything is written, with what to do about it."""
from __future__ import annotations

import sys

import pytest

from trainer.core.errors import UserError
from trainer.models import gguf_support
from trainer.worker.export import staging


def test_a_failed_export_leaves_nothing_and_a_retry_works(tmp_path):
    to = tmp_path / "new" / "deeper" / "out"
    with pytest.raises(RuntimeError):
        with staging.staged_folder(to) as tmp:
            (tmp / "model.safetensors").write_bytes(b"half")
            raise RuntimeError("the converter failed")
    assert list(tmp_path.iterdir()) == []  # neither the files, the hidden folder, nor the parents it made
    with staging.staged_folder(to) as tmp:
        (tmp / "model.safetensors").write_bytes(b"whole")
    assert [p.name for p in to.iterdir()] == ["model.safetensors"] and not list(to.parent.glob(".*"))


def test_an_export_that_differs_from_training_is_set_aside_and_the_destination_untouched(tmp_path):
    to = tmp_path / "out"
    to.mkdir()
    (to / "notes.txt").write_text("mine")
    for attempt in range(2):
        with pytest.raises(RuntimeError):
            with staging.staged_folder(to) as tmp:
                (tmp / "model-f16.gguf").write_bytes(b"gguf")
                aside = staging.set_aside(tmp, to)
                raise RuntimeError("the export differs from training")
        assert (aside / "model-f16.gguf").read_bytes() == b"gguf" and aside.stat().st_mode & 0o755 == 0o755
    assert [p.name for p in to.iterdir()] == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir())[:2] == ["out", "out.unverified"]
    assert len(list(tmp_path.glob("out.unverified*"))) == 2 and not list(tmp_path.glob(".*"))


def test_files_get_ordinary_modes_not_mkdtemps_0700(tmp_path):
    to = tmp_path / "out"
    with staging.staged_folder(to) as tmp:
        (tmp / "Modelfile").write_text("FROM ./m.gguf\n")
    assert to.stat().st_mode & 0o755 == 0o755 and (to / "Modelfile").stat().st_mode & 0o644 == 0o644


def test_overwrite_replaces_same_names_and_keeps_the_users_other_files(tmp_path):
    to = tmp_path / "out"
    to.mkdir()
    (to / "notes.txt").write_text("mine")
    (to / "Modelfile").write_text("old")
    with staging.staged_folder(to) as tmp:
        (tmp / "Modelfile").write_text("new")
    assert (to / "notes.txt").read_text() == "mine" and (to / "Modelfile").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_unknown_architecture_is_refused_naming_it_and_the_way_out():
    if gguf_support.converter_dir() is None:
        pytest.skip(f"llama.cpp's converter is not here: {gguf_support.GET_IT}")
    reason = gguf_support.refusal("f16", "ToyNetForCausalLM")
    assert "'ToyNetForCausalLM'" in reason and "export without --gguf" in reason
    for arch in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM",
                 "Phi3ForCausalLM", "Gemma2ForCausalLM"):
        assert gguf_support.refusal("q8_0", arch) is None, arch


def test_missing_converter_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINPILOT_LLAMA_CPP", str(tmp_path / "nothing"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv"))
    reason = gguf_support.refusal("f16", "LlamaForCausalLM")
    assert "convert_hf_to_gguf.py" in reason and "TRAINPILOT_LLAMA_CPP" in reason and "install.sh" in reason


def test_q4_k_m_without_a_quantizer_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    if gguf_support.converter_dir() is None:
        pytest.skip(f"llama.cpp's converter is not here: {gguf_support.GET_IT}")
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if llama-cpp-python were not installed
    assert gguf_support.quantizer() is None
    options = gguf_support.options("LlamaForCausalLM")
    assert options["f16"] is None and options["q8_0"] is None
    assert f"llama-cpp-python=={gguf_support.LLAMA_CPP_PYTHON}" in options["q4_k_m"] and "ollama create" in options["q4_k_m"]
    from trainer.cli.main import main

    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    (run / "config.yaml").write_text("name: run\n")
    (run / "final" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    assert main(["export-model", str(run), "--to", str(tmp_path / "out"), "--gguf", "q4_k_m"]) == 2
    assert not (tmp_path / "out").exists()


def test_the_worker_refuses_an_unknown_architecture_before_writing(tmp_path):
    """A LoRA run has no config.json of its own: the worker checks the loaded model's architecture."""
    if gguf_support.converter_dir() is None:
        pytest.skip(f"llama.cpp's converter is not here: {gguf_support.GET_IT}")
    from types import SimpleNamespace

    from trainer.worker.export import model_export

    model = SimpleNamespace(config=SimpleNamespace(architectures=["ToyNetForCausalLM"]))
    with pytest.raises(UserError, match="ToyNetForCausalLM"):
        model_export.check_gguf("f16", model)
