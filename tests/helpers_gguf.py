"""Helpers for the export tests: the pinned llama.cpp sources (templates, converter), Go's text/template
(``tests/go/ollama_render``), and llama-cpp-python — each skipped with a reason where it is missing."""
from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from trainer.models import gguf_support

GO_RENDER = Path(__file__).resolve().parent / "go" / "ollama_render"
FAMILY_TEMPLATES = {  # family -> file under llama.cpp's models/templates (the real chat templates)
    "qwen2.5": "Qwen-Qwen2.5-7B-Instruct", "llama-3.1": "meta-llama-Llama-3.1-8B-Instruct",
    "llama-3.2": "meta-llama-Llama-3.2-3B-Instruct", "qwen3": "Qwen-Qwen3-0.6B",
    "mistral-nemo": "mistralai-Mistral-Nemo-Instruct-2407", "phi-3.5": "microsoft-Phi-3.5-mini-instruct",
    "gemma-2": "google-gemma-2-2b-it", "deepseek-r1-distill": "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
}


def llama_cpp_dir() -> Path:
    """The pinned llama.cpp folder (converter, templates); skips the test when it is not on this machine."""
    folder = gguf_support.converter_dir()
    if folder is None:
        pytest.skip(f"llama.cpp's sources are not here: {gguf_support.GET_IT}")
    return folder


def family_template(family: str) -> str:
    """The real Jinja chat template of ``family`` from llama.cpp's models/templates."""
    path = llama_cpp_dir() / "models" / "templates" / f"{FAMILY_TEMPLATES[family]}.jinja"
    if not path.is_file():
        pytest.skip(f"{path} is missing from this llama.cpp copy")
    return path.read_text(encoding="utf-8")


def go_env() -> dict:
    """Environment for ``go``: build cache and GOPATH under the dev cache (CI reuses them), no downloads."""
    root = gguf_support.dev_cache_dir() / "go"
    return dict(os.environ, GOCACHE=str(root / "cache"), GOPATH=str(root / "path"), GOTOOLCHAIN="local",
                GOFLAGS="", GO111MODULE="off")


@functools.lru_cache(maxsize=1)
def _go_binary() -> str:
    go = shutil.which("go")
    if go is None:
        pytest.skip("Go is not installed (Debian: apt-get install golang-go); the Ollama TEMPLATE renders are "
                    "checked with Go's own text/template")
    out = gguf_support.dev_cache_dir() / "go" / "ollama_render"
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([go, "build", "-o", str(out), "main.go"], cwd=GO_RENDER, env=go_env(), check=True,
                   capture_output=True, timeout=300)
    return str(out)


def go_render(requests: list[dict]) -> list[list[str]]:
    """Render ``[{"template", "cases"}]`` with Go's text/template as Ollama's server does (see main.go)."""
    proc = subprocess.run([_go_binary()], input=json.dumps(requests), capture_output=True, text=True,
                          encoding="utf-8", timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)
