"""The vision projector of a vision-language export: ``mmproj-model-f16.gguf`` through llama.cpp's own converter
(``convert_hf_to_gguf.py --mmproj``), beside the text model's GGUF.

llama.cpp reads a picture with two files: the text model's GGUF and the projector's (the vision tower and the
connector, ``general.architecture`` ``clip``): ``llama-mtmd-cli -m model-f16.gguf --mmproj mmproj-model-f16.gguf``.
Whether the pinned converter writes one depends on the architecture (its ``MMPROJ_MODEL_MAP``, then the vision
tower's type: LLaVA 1.5's CLIP tower is not among those it maps); where it cannot, the export keeps the text GGUF and
says so in one line. The projector is written in f16 whatever the text GGUF's type (llama.cpp's advice: its
quantisation costs accuracy for little size). The export's verification covers the text GGUF.
"""
from __future__ import annotations

from pathlib import Path

from trainer.models import gguf_support
from trainer.worker.export import gguf_convert

FILE = "mmproj-model-f16.gguf"


def write(llama_cpp: Path, folder: Path, config: dict, name: str, progress) -> tuple[str | None, str]:
    """Write the projector GGUF of the model in ``folder`` (its HF ``config`` as a dict); ``(file name or None, one
    line saying what was written or why not)``."""
    arch = gguf_support.projector_architecture(config) or "?"
    if arch not in gguf_support.converter_projectors(llama_cpp):
        return None, (f"no projector GGUF: llama.cpp's converter (llama-cpp-python {gguf_support.LLAMA_CPP_PYTHON}) "
                      f"writes none for {arch}; the GGUF answers text only (pictures: transformers, with the "
                      f"safetensors and the processor here)")
    progress.step("writing the vision projector GGUF (mmproj) with llama.cpp's convert_hf_to_gguf.py --mmproj")
    try:
        gguf_convert.convert(llama_cpp, folder, folder / FILE, "f16", name, mmproj=True)
    except gguf_convert.ConversionFailed as exc:
        (folder / FILE).unlink(missing_ok=True)
        why = str(exc).removeprefix("--gguf: ").split(" [")[0]
        return None, (f"no projector GGUF: {why} ({arch}); the GGUF answers text only (pictures: transformers, "
                      f"with the safetensors and the processor here)")
    return FILE, (f"projector: {FILE} (llama.cpp: llama-mtmd-cli -m <model>.gguf --mmproj {FILE}); the verification "
                  f"covers the text model")


def ollama_line(projector: str | None) -> str:
    """What the Modelfile does with pictures, in one line."""
    if projector is None:
        return "Ollama: text only (no projector GGUF for this model)"
    return (f"Ollama: the Modelfile names the projector in a second FROM (Ollama's import of a separate projector); "
            f"whether Ollama's runner reads pictures with this projector type is Ollama's and is not checked here")
