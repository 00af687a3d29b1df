"""GGUF through llama.cpp's own converter: ``convert_hf_to_gguf.py`` (and its ``conversion/`` and ``gguf-py``)
from the pinned llama-cpp-python source distribution (``trainer.models.gguf_support`` finds it).

The parent (``convert``) runs this module as a child process on a merged safetensors folder:
``python -m trainer.worker.export.gguf_convert LLAMA_CPP_DIR MODEL_DIR OUTFILE f16|q8_0``. The child
runs the converter's own ``main()`` with one addition: llama.cpp names a BPE tokenizer's pre-tokenizer
by hashing its ids on a test string, so a tokenizer trained for the run (the demo's) is never in its
list. When the hash is unknown and the tokenizer's split rule is exactly one llama.cpp implements
(plain GPT-2 byte-level, or a Split regex equal to a named one), the child answers with that name
instead of failing; anything else still fails as the converter does.

Q4_K_M is quantized from the f16 file by llama.cpp's ``llama_model_quantize`` (llama-cpp-python).
"""
from __future__ import annotations

import ctypes
import json
import logging
import runpy
import subprocess
import sys
from pathlib import Path

from trainer.core import entrypoints
from trainer.core.errors import TrainPilotError

_PRE_NAMES = ("llama-bpe", "qwen2", "tekken", "gpt-4o")  # preferred llama.cpp names where regexes coincide
log = logging.getLogger("trainpilot.gguf")


class ConversionFailed(TrainPilotError):
    """llama.cpp's converter or quantizer failed on a model it should handle (exit 1, its last words)."""


def pre_tokenizer_name(tokenizer_json: dict) -> str | None:
    """llama.cpp's name for how the tokenizer splits text before BPE ('gpt-2' for plain byte-level); None if none fits."""
    pre = tokenizer_json.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    regexes = [p.get("pattern", {}).get("Regex") for p in parts if p.get("type") == "Split"]
    if not regexes and any(p.get("type") == "ByteLevel" and p.get("use_regex", True) for p in parts):
        return "gpt-2"
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    for wanted in _PRE_NAMES + tuple(GGUF_PRE_TOKENIZER_SPLITS):
        if len(regexes) == 1 and GGUF_PRE_TOKENIZER_SPLITS.get(wanted) == regexes[0]:
            return wanted
    return None


def _patch_pre_tokenizer(text_model) -> None:
    original = text_model.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer):
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            path = Path(self.dir_model) / "tokenizer.json"
            name = pre_tokenizer_name(json.loads(path.read_text(encoding="utf-8"))) if path.is_file() else None
            if name is None:
                raise
            log.warning("TrainPilot: the tokenizer's pre-tokenizer hash is not in llama.cpp's list; its split "
                        "rule is llama.cpp's '%s', so the GGUF says so", name)
            return name

    text_model.get_vocab_base_pre = get_vocab_base_pre


def child_main(argv: list[str]) -> int:
    """Run llama.cpp's converter (see the module docstring); returns its exit status."""
    mmproj = "--mmproj" in argv  # the vision projector instead of the text model
    llama_cpp, model, outfile, outtype, *name = [a for a in argv if a != "--mmproj"]
    sys.path[:0] = [llama_cpp, str(Path(llama_cpp) / "gguf-py")]
    import conversion.base

    _patch_pre_tokenizer(conversion.base.TextModel)
    sys.argv = [str(Path(llama_cpp) / "convert_hf_to_gguf.py"), model, "--outfile", outfile, "--outtype", outtype]
    sys.argv += ["--mmproj"] if mmproj else []
    sys.argv += ["--model-name", name[0]] if name else []  # general.name: the run's, not the staging folder's
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else 1
    return 0


def convert(llama_cpp: Path, model_dir: Path, outfile: Path, outtype: str, name: str | None = None,
            mmproj: bool = False) -> Path:
    """Convert the HF folder ``model_dir`` to ``outfile`` (``f16`` or ``q8_0``) in a child, ``general.name`` ``name``
    (default: llama.cpp's, from the folder); ``mmproj``: its vision projector (``--mmproj``) instead of the text
    model. ConversionFailed if not."""
    cmd = entrypoints.python_m(entrypoints.GGUF_CONVERT, llama_cpp, model_dir, outfile, outtype, *([name] if name else []),
                               *(["--mmproj"] if mmproj else []))
    proc = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", errors="replace")
    if proc.returncode != 0 or not outfile.is_file():
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "WARNING" not in ln[:40]]
        raise ConversionFailed(f"--gguf: llama.cpp's converter failed (exit {proc.returncode}): "
                               + (lines[-1].strip() if lines else "no message") + f" [{llama_cpp / 'convert_hf_to_gguf.py'}]")
    return outfile


def quantize_q4_k_m(f16: Path, out: Path) -> Path:
    """Quantize the f16 GGUF ``f16`` to Q4_K_M at ``out`` with llama.cpp's quantizer (llama-cpp-python)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    rc = llama_cpp.llama_model_quantize(str(f16).encode(), str(out).encode(), ctypes.byref(params))
    if rc != 0 or not out.is_file():
        raise ConversionFailed(f"--gguf q4_k_m: llama.cpp's quantizer returned {rc} for {f16}")
    return out


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
