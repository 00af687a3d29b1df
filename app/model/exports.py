"""What the two export dialogs need to know before and after their child runs (plain Python, no Qt):
is the run's model a LoRA adapter, can the chosen folder be written, which files did the export write."""
from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from trainer.core.errors import TrainPilotError
from trainer.models import gguf_support
from trainer.rundir.trained import model_dir

ADAPTER_METHODS = ("lora", "qlora")


def training_method(run_dir: str | Path) -> str | None:
    """``method.type`` of the run's config.yaml ('full', 'lora', 'qlora'), or None when unreadable."""
    try:
        cfg = yaml.safe_load((Path(run_dir) / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    method = (cfg or {}).get("method") if isinstance(cfg, dict) else None
    kind = method.get("type") if isinstance(method, dict) else None
    return str(kind) if kind else None


def is_adapter_run(run_dir: str | Path) -> bool:
    """True when the run trains a LoRA/QLoRA adapter (so merging it into the base weights means something)."""
    return training_method(run_dir) in ADAPTER_METHODS


def folder_problem(folder: str) -> str | None:
    """Why files cannot be written into ``folder`` (to be created if missing), or None when they can.
    Says the fix: a folder the user can write to."""
    text = folder.strip()
    if not text:
        return "Folder: empty; choose a folder to export into."
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        return f"Folder: {path} is a file; choose a folder."
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent  # the nearest folder that exists is where the new one is made
    if not existing.is_dir():
        return f"Folder: {existing} is a file, so {path} cannot be made there; choose another folder."
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"Folder: {existing} cannot be written (permission denied); choose a folder you can write to."
    return None


def export_output(stdout: str) -> tuple[list[str], str]:
    """``trainpilot-cli export``'s output as (the files it wrote, the command to run): it prints one
    path per line, a blank line, then 'run it with:  COMMAND'."""
    files, command = [], ""
    for line in stdout.splitlines():
        text = line.strip()
        if text.startswith("run it with:"):
            command = text.split(":", 1)[1].strip()
        elif text:
            files.append(text)
    return files, command


def gguf_formats(run_dir: str) -> dict[str, str | None]:
    """``{gguf type: None if this run's model can get it, else why not}``, from files only (no torch)."""
    try:
        source = model_dir(run_dir)
    except TrainPilotError as exc:
        return {kind: str(exc) for kind in gguf_support.GGUF_TYPES}
    return gguf_support.options(gguf_support.architecture_for(Path(run_dir), source))


def formats_text(formats: dict[str, str | None]) -> str:
    """One line per GGUF type that cannot be written, or that all can (and with which quantizer)."""
    lines = [f"{kind}: {export_words(why)}" for kind, why in formats.items() if why]
    if formats.get("q4_k_m") is None:
        lines.insert(0, f"GGUF f16, q8_0 and q4_k_m (quantized with {gguf_support.quantizer()}) can be written.")
    return "\n".join(lines)


# The export commands' messages name their flags; the dialogs have check boxes and fields for them (first match wins
# per phrase; the message is otherwise kept as the CLI wrote it).
EXPORT_WORDS = (
    (r"not an export written by 'trainpilot-cli export-model --gguf'", "not a GGUF export made by TrainPilot"),
    (r"pass a folder written by export-model --gguf", "choose the folder an Export model with a GGUF type wrote"),
    (r"export the run (again )?with --gguf", r"export the run \1(Export model…) with a GGUF type chosen"),
    (r"pass its folder: trainpilot-cli verify-export EXPORT_DIR --run-dir RUN_DIR", "choose its folder under Run folder"),
    (r"export again with --no-verify to skip it", "export again with Verify unticked to skip it"),
    (r"export without --ollama", "export without the Ollama Modelfile"),
    (r"export --gguf f16 --ollama", "export GGUF f16 with the Ollama Modelfile"),
    (r"add --gguf q8_0 \(or f16\)", "choose a GGUF type (q8_0 or f16)"),
    (r"(^|: )--to (.*?): (.*?) or add --overwrite", r"\1\2: \3"),
    (r"(^|: )--to ", r"\1Folder "),
    (r"(^|: )--gguf ", r"\1GGUF "),
    (r"(^|: )--gguf:", r"\1GGUF:"),
    (r"(^|: )--ollama:", r"\1Ollama Modelfile:"),
    (r"pass a folder under runs/", "choose a run folder"),
)


def export_words(message: str) -> str:
    """An export or verification message in the dialogs' words: "Verify unticked", "Run folder", "a GGUF type
    chosen" for the CLI's --no-verify, --run-dir and --gguf."""
    for pattern, words in EXPORT_WORDS:
        message = re.sub(pattern, words, message, flags=re.MULTILINE)
    return message
