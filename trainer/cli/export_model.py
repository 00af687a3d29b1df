"""``trainpilot-cli export-model RUN_DIR --to DIR [--merge] [--gguf f16|q8_0|q4_k_m] [--ollama]``.

Light checks here (run directory, checkpoint, destination, flag combinations, whether llama.cpp's
converter, the architecture and a Q4_K_M quantizer are at hand); the model work is in
the worker room (``trainer.worker.export.model_export``), imported only when the checks pass.
"""
from __future__ import annotations

from pathlib import Path

from trainer.core.errors import UserError
from trainer.models import gguf_support
from trainer.rundir.trained import model_dir, refuse_while_training


def register(sub) -> None:
    """Add the ``export-model`` subcommand."""
    p = sub.add_parser("export-model", help="export the trained model: merged safetensors, GGUF for llama.cpp, "
                                            "an Ollama Modelfile")
    p.add_argument("run_dir", help="run directory")
    p.add_argument("--to", required=True, help="folder to write into (new or empty)")
    p.add_argument("--checkpoint", default=None, help="a checkpoint step or 'final' (default: final/, else the newest)")
    p.add_argument("--merge", action="store_true",
                   help="merge a LoRA adapter into the base weights (a full model; implied by --gguf)")
    p.add_argument("--gguf", choices=gguf_support.GGUF_TYPES, default=None,
                   help="also write a GGUF file with llama.cpp's convert_hf_to_gguf.py (q4_k_m: needs llama-cpp-python)")
    p.add_argument("--ollama", action="store_true", help="also write an Ollama Modelfile next to the GGUF")
    p.add_argument("--overwrite", action="store_true", help="write into a folder that already has files")
    p.add_argument("--json", action="store_true", help='print progress as JSON lines {"type": "progress", ...}')
    p.set_defaults(func=run)


def run(args) -> int:
    """Check the request, then export in the worker room."""
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory; pass a folder under runs/", path=str(run_dir))
    if args.ollama and not args.gguf:
        raise UserError("--ollama: Ollama runs GGUF files; add --gguf q8_0 (or f16)", field="--ollama")
    source = model_dir(run_dir, args.checkpoint)
    to = Path(args.to)
    if to.exists() and not to.is_dir():
        raise UserError(f"--to {to}: is a file; pass a folder", field="--to", path=str(to))
    if to.is_dir() and any(to.iterdir()) and not args.overwrite:
        raise UserError(f"--to {to}: the folder already has files; pick a new folder or add --overwrite",
                        field="--to", path=str(to))
    if to.resolve() == run_dir.resolve() or run_dir.resolve() in to.resolve().parents:
        raise UserError(f"--to {to}: inside the run directory; export somewhere else", field="--to", path=str(to))
    if args.gguf:
        reason = gguf_support.refusal(args.gguf, gguf_support.architecture_for(run_dir, source))
        if reason:
            raise UserError(f"--gguf {args.gguf}: {reason}", field="--gguf")
    refuse_while_training(run_dir, "export it")
    from trainer.worker.export import model_export as export_model

    files = export_model.export(run_dir, source, to, merge=args.merge or bool(args.gguf), gguf_type=args.gguf,
                                ollama=args.ollama, json_progress=args.json)
    if not args.json:
        for f in files:
            print(f)
    return 0
