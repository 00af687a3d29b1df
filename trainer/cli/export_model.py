"""``trainpilot-cli export-model RUN_DIR --to DIR [--merge] [--gguf f16|q8_0|q4_k_m] [--ollama] [--no-verify]`` and
``trainpilot-cli verify-export EXPORT_DIR [--run-dir RUN_DIR] [--json]``.

Light checks here (run directory, checkpoint, destination, flag combinations, whether llama.cpp's
converter, the architecture and a Q4_K_M quantizer are at hand); the model work is in
the worker room (``trainer.worker.export.model_export``), imported only when the checks pass. A GGUF export is
verified on the run's own prompts before it is moved into place (``trainer.worker.export.verify``); exit 4 when it
differs from training (the files are set aside as ``DIR.unverified``), and ``verify-export`` repeats those checks.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from trainer.core.errors import EXIT_BAD_INPUT, EXIT_EXPORT_DIFFERS, UserError
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
    p.add_argument("--no-verify", action="store_true",
                   help="do not check the GGUF in llama.cpp (and the Modelfile) on the run's own prompts")
    p.add_argument("--json", action="store_true", help='print progress as JSON lines {"type": "progress", ...}')
    p.set_defaults(func=run)
    v = sub.add_parser("verify-export", help="check an export in llama.cpp and its Ollama Modelfile against the run it "
                                             "came from (exit 4 when anything differs)")
    v.add_argument("export_dir", help="a folder written by export-model --gguf")
    v.add_argument("--run-dir", default=None, help="the run's folder, when it moved since the export")
    v.add_argument("--json", action="store_true", help="print the verification (verification.json) as JSON")
    v.set_defaults(func=run_verify)


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

    files, result = export_model.export(run_dir, source, to, merge=args.merge or bool(args.gguf), gguf_type=args.gguf,
                                        ollama=args.ollama, json_progress=args.json, verify_export=not args.no_verify)
    if not args.json:
        for f in files:
            print(f)
        if result is not None:
            print(result["summary"], file=sys.stderr)
    return 0


def run_verify(args) -> int:
    """Repeat an export's checks from its own record; exit 0 verified, 4 differs, 2 cannot verify."""
    folder = Path(args.export_dir)
    if not folder.is_dir():
        raise UserError(f"{folder}: no such folder; pass a folder written by export-model --gguf", path=str(folder))
    if not (folder / "trainpilot-export.json").is_file():
        raise UserError(f"{folder}: not an export written by 'trainpilot-cli export-model --gguf' (no "
                        f"trainpilot-export.json); export the run with --gguf", path=str(folder))
    from trainer.worker.export import model_export

    result = model_export.run_verification(folder, Path(args.run_dir) if args.run_dir else None)
    print(json.dumps(result, ensure_ascii=False) if args.json else result["summary"], flush=True)
    if result["verified"] is None:
        return EXIT_BAD_INPUT
    return 0 if result["verified"] else EXIT_EXPORT_DIFFERS
