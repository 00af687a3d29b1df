"""installers/fetch_llama_cpp.py: the installers' step that puts llama.cpp's converter where TrainPilot
looks (<prefix>/llama.cpp): only the converter's files, from an archive in a wheelhouse without pip
(offline), never half-written, and a plain message (exit 1) when the sources are not at hand."""
from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

from trainer.models.gguf_support import LLAMA_CPP_PYTHON

SCRIPT = Path(__file__).resolve().parents[1] / "installers" / "fetch_llama_cpp.py"


def _sdist(folder: Path, version: str = LLAMA_CPP_PYTHON) -> Path:
    """A small archive laid out like the llama-cpp-python sdist (converter files and others)."""
    path = folder / f"llama_cpp_python-{version}.tar.gz"
    root = f"llama_cpp_python-{version}/vendor/llama.cpp/"
    files = {root + "convert_hf_to_gguf.py": "print('convert')\n", root + "conversion/__init__.py": "TEXT_MODEL_MAP = {}\n",
             root + "gguf-py/gguf/__init__.py": "", root + "LICENSE": "MIT\n", root + "src/llama.cpp": "// C++\n",
             f"llama_cpp_python-{version}/llama_cpp/llama.py": "", root + "models/ggml-vocab-gpt-2.gguf": "x"}
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return path


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)


def test_unpacks_only_the_converter_from_a_wheelhouse_offline(tmp_path):
    wheelhouse = tmp_path / "wh"
    wheelhouse.mkdir()
    _sdist(wheelhouse)
    dest = tmp_path / "prefix" / "llama.cpp"
    proc = _run("--dest", dest, "--offline", "--find-links", wheelhouse)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert got == [".version", "LICENSE", "conversion/__init__.py", "convert_hf_to_gguf.py", "gguf-py/gguf/__init__.py"]
    assert _run("--dest", dest, "--offline").stdout.startswith("llama.cpp's GGUF converter")  # already there


def test_offline_without_the_archive_says_how_and_leaves_nothing(tmp_path):
    dest = tmp_path / "prefix" / "llama.cpp"
    proc = _run("--dest", dest, "--offline", "--find-links", tmp_path)
    assert proc.returncode == 1 and f"pip download --no-deps --no-binary :all: llama-cpp-python=={LLAMA_CPP_PYTHON}" in proc.stdout
    assert "TRAINPILOT_LLAMA_CPP" in proc.stdout and "Traceback" not in proc.stderr and not dest.exists()
