"""Which GGUF files a model can get, decided without torch (the CLI's checks and the GUI's Export dialog).

GGUF is written by llama.cpp's own converter, ``convert_hf_to_gguf.py`` with its ``conversion/`` package
and ``gguf-py``, taken from the pinned llama-cpp-python source distribution (which vendors llama.cpp).
Where it lives, first found wins:

1. ``$TRAINPILOT_LLAMA_CPP`` (a folder holding ``convert_hf_to_gguf.py``);
2. ``<install prefix>/llama.cpp``: the installers unpack it next to the app's environment (``sys.prefix``
   is ``<prefix>/venv``);
3. ``${XDG_CACHE_HOME:-~/.cache}/trainpilot-dev/llama_cpp_python-<version>/vendor/llama.cpp`` (dev and CI).

The architectures it converts are read from ``conversion/__init__.py``'s ``TEXT_MODEL_MAP`` as text
(``ast``), so asking costs milliseconds and imports nothing. 4-bit Q4_K_M needs a quantizer:
llama.cpp's ``llama_model_quantize`` through the ``llama_cpp`` package (llama-cpp-python).
"""
from __future__ import annotations

import ast
import functools
import json
import os
import sys
from pathlib import Path

import yaml

from trainer.core import capabilities
from trainer.core.paths import MODELS_DIR

LLAMA_CPP_PYTHON = "0.3.36"  # the pinned llama-cpp-python sdist whose vendored llama.cpp converts
GGUF_TYPES = ("f16", "q8_0", "q4_k_m")
CONVERTER = "convert_hf_to_gguf.py"
GET_IT = (f"install TrainPilot with installers/linux/install.sh or installers/windows/install.ps1 (they unpack "
          f"it), or run: pip download --no-deps --no-binary :all: llama-cpp-python=={LLAMA_CPP_PYTHON} and "
          f"unpack the archive's vendor/llama.cpp folder, then set TRAINPILOT_LLAMA_CPP to that folder")
QUANTIZER_HINT = (f"pip install llama-cpp-python=={LLAMA_CPP_PYTHON} (llama.cpp's quantizer); or export --gguf f16 "
                  f"--ollama and run: ollama create NAME --quantize q4_K_M -f Modelfile")


def dev_cache_dir() -> Path:
    """The folder dev-setup and CI unpack the sdist into (``${XDG_CACHE_HOME:-~/.cache}/trainpilot-dev``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trainpilot-dev"


def candidate_dirs() -> list[Path]:
    """Where the converter is looked for, in order (see the module docstring)."""
    found = [Path(os.environ["TRAINPILOT_LLAMA_CPP"])] if os.environ.get("TRAINPILOT_LLAMA_CPP") else []
    return found + [Path(sys.prefix).parent / "llama.cpp",
                    dev_cache_dir() / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"]


def converter_dir() -> Path | None:
    """The llama.cpp folder holding ``convert_hf_to_gguf.py``, ``conversion/`` and ``gguf-py/``; None if absent."""
    for d in candidate_dirs():
        if (d / CONVERTER).is_file() and (d / "conversion" / "__init__.py").is_file() and (d / "gguf-py").is_dir():
            return d
    return None


def converter_architectures(folder: Path) -> frozenset[str]:
    """The HF ``architectures`` names llama.cpp's converter in ``folder`` converts to text GGUF."""
    return _converter_map(folder, "TEXT_MODEL_MAP")


def converter_projectors(folder: Path) -> frozenset[str]:
    """The HF ``architectures`` names llama.cpp's converter in ``folder`` writes a projector (``--mmproj``) for."""
    return _converter_map(folder, "MMPROJ_MODEL_MAP")


def projector_architecture(config: dict) -> str | None:
    """The architecture llama.cpp's converter writes a projector (``--mmproj``) as: ``vision_config.architectures[0]``
    when there is one, else ``architectures[0]`` (the converter's own choice)."""
    vision = config.get("vision_config") if isinstance(config.get("vision_config"), dict) else {}
    arches = vision.get("architectures") or config.get("architectures") or []
    return arches[0] if arches else None


@functools.lru_cache(maxsize=8)
def _converter_map(folder: Path, name: str) -> frozenset[str]:
    """The keys of the dict ``name`` in the converter's ``conversion/__init__.py``, read as text (``ast``)."""
    tree = ast.parse((folder / "conversion" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        target = getattr(node, "target", None) or (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == name and node.value is not None:
            return frozenset(ast.literal_eval(node.value))
    return frozenset()


def quantizer() -> str | None:
    """The Q4_K_M quantizer at hand: ``"llama.cpp (llama-cpp-python)"``, or None."""
    return "llama.cpp (llama-cpp-python)" if capabilities.installed("llama-cpp-python") else None


def architecture_of(config_json: Path) -> str | None:
    """The architecture llama.cpp's converter writes a text GGUF as, from an HF ``config.json``: its
    ``text_config.architectures[0]`` when there is one (SmolVLM's text model is a ``VLlama3ForCausalLM``), else
    ``architectures[0]`` — the converter's own choice; None if unknown."""
    try:
        return text_architecture(json.loads(config_json.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None


def text_architecture(config: dict) -> str | None:
    """``text_config.architectures[0]``, else ``architectures[0]`` of a config dict (see ``architecture_of``)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    arches = text.get("architectures") or config.get("architectures") or []
    return arches[0] if arches else None


def refusal(kind: str, architecture: str | None) -> str | None:
    """Why ``--gguf kind`` cannot be written for ``architecture`` here (None: it can; unknown arch: not refused)."""
    if kind not in GGUF_TYPES:
        return f"'{kind}' is not a GGUF type TrainPilot writes ({', '.join(GGUF_TYPES)})"
    folder = converter_dir()
    if folder is None:
        return (f"llama.cpp's converter (convert_hf_to_gguf.py) is not on this machine; {GET_IT}; or export "
                f"without --gguf")
    if architecture is not None and architecture not in converter_architectures(folder):
        return (f"llama.cpp's converter (llama-cpp-python {LLAMA_CPP_PYTHON}) does not know the architecture "
                f"'{architecture}'; export without --gguf (safetensors, for transformers/vLLM), or convert the "
                f"folder later with a newer llama.cpp's convert_hf_to_gguf.py")
    if kind == "q4_k_m" and quantizer() is None:
        return f"4-bit Q4_K_M needs a quantizer and none is installed: {QUANTIZER_HINT}"
    return None


def options(architecture: str | None) -> dict[str, str | None]:
    """``{gguf type: None if it can be written, else the reason}`` for the Export dialog."""
    return {kind: refusal(kind, architecture) for kind in GGUF_TYPES}


def architecture_for(run_dir: Path, source: Path) -> str | None:
    """The architecture of the model in ``source`` (final/ or a checkpoint of ``run_dir``), read from files:
    its config.json; an adapter's local base model; the run's bundled architecture. None: known only
    once the model is loaded (a hub base model), and then checked before anything is written."""
    found = architecture_of(source / "config.json")
    adapter = source / "adapter_config.json"
    if found is None and adapter.is_file():
        base = json.loads(adapter.read_text(encoding="utf-8")).get("base_model_name_or_path") or ""
        found = architecture_of(Path(base) / "config.json") if base and Path(base).is_dir() else None
    if found is None and (run_dir / "config.yaml").is_file():
        model = (yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) or {}).get("model") or {}
        name = model.get("architecture") or ("tiny-llama" if model.get("source") == "demo-tiny-llama" else None)
        path = Path(name) if name and name.endswith(".json") else MODELS_DIR / f"{name}.json"
        found = architecture_of(path) if name else None
    return found
