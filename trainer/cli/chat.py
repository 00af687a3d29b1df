"""``trainpilot-cli chat RUN_DIR [--checkpoint STEP|final] [--base] [--prompt TEXT] [--image FILE] [--json]``.

Light checks here (run directory, checkpoint, not training right now); the model is loaded by the
worker room (imported only when the checks pass).
"""
from __future__ import annotations

from pathlib import Path

from trainer.core.errors import UserError
from trainer.data.pictures import unreadable
from trainer.rundir.trained import model_dir, refuse_while_training


def register(sub) -> None:
    """Add the ``chat`` subcommand."""
    p = sub.add_parser("chat", help="talk to a trained model (final/ or a checkpoint), or to its base model")
    p.add_argument("run_dir", help="run directory")
    p.add_argument("--checkpoint", default=None, help="a checkpoint step or 'final' (default: final/, else the newest)")
    p.add_argument("--base", action="store_true", help="answer with the base model (before training) instead")
    p.add_argument("--prompt", default=None, help="answer this one message and exit (default: read lines from stdin)")
    p.add_argument("--image", default=None, metavar="FILE",
                   help="a picture the message is about (a vision-language model; every message when reading stdin)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help='print {"text", "tokens", ...} per answer instead of text')
    out.add_argument("--stream-json", action="store_true",
                     help='print JSON lines as tokens arrive: {"type": "token", "text"} ... {"type": "done", ...}')
    p.add_argument("--max-new-tokens", type=int, default=256, help="longest answer, in tokens (default 256)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature; 0 is greedy (default 0.7)")
    p.add_argument("--top-p", type=float, default=0.9, help="nucleus sampling mass (default 0.9)")
    p.add_argument("--seed", type=int, default=None, help="seed for sampling (repeatable answers)")
    p.set_defaults(func=run)


def run(args) -> int:
    """Check the request, then load and generate in the worker room."""
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory; pass a folder under runs/", path=str(run_dir))
    if args.max_new_tokens <= 0:
        raise UserError("--max-new-tokens: must be a positive number of tokens", field="--max-new-tokens")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        raise UserError("--temperature must be >= 0 and --top-p in (0, 1]", field="--temperature")
    image = None
    if args.image is not None:
        image = Path(args.image).expanduser().resolve()
        problem = unreadable(image)
        if problem:
            raise UserError(f"--image: {problem}; give a picture file (PNG, JPEG, WebP...)", field="--image",
                            path=str(image))
    source = model_dir(run_dir, args.checkpoint)
    refuse_while_training(run_dir, "chat with it")
    from trainer.worker.generate import generation as worker_chat

    mode = "stream-json" if args.stream_json else "json" if args.json else "text"
    return worker_chat.run_chat(run_dir, source, base=args.base, prompt=args.prompt, mode=mode,
                                max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                top_p=args.top_p, seed=args.seed, image=image)
