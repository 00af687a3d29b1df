"""``python -m trainer.worker.probes.reward_preview CONFIG [--prompts N] [--completions K]``: what the rewards say
about the base model's answers, before a GRPO run starts (the wizard's Reward page runs it in the background).

The first N prompts of ``data.path`` are rendered as the GRPO worker renders them (``datapipe.grpo_prompts``:
the chat template with the generation prompt, ``grpo.system_prompt`` first, when the tokenizer has one; plain
text otherwise); K completions of each are sampled from the base model with the run's sampling settings
(``grpo.temperature``, ``top_p``, ``top_k``, ``max_completion_length``) and scored by ``reward_functions(cfg)``, the
same rewards the run will use, called as TRL calls them. Prints one JSON document on stdout:

    {"model": ..., "chat_template": bool, "functions": [{"name", "weight", "builtin"}],
     "prompts": [{"prompt": text as the model reads it, "reference": ..., "completions":
                  [{"text", "tokens", "stopped": "end_of_turn"|"max_length", "rewards": {name: value|null}, "total"}]}],
     "seconds": ...}

Exit 2 with one line on stderr naming the field for bad input (config, data, rewards, arguments); the cheap
checks (config, records, the reward file) run before the model loads.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from trainer import config as config_mod
from trainer.core import secrets
from trainer.core.errors import EXIT_BAD_INPUT, UserError
from trainer.data import prompts as prompts_mod
from trainer.data import rewards as rewards_mod
from trainer.worker.datapipe import grpo_prompts


class _Args(argparse.ArgumentParser):
    def error(self, message: str):  # one line naming the argument, exit 2 (argparse prints usage too)
        raise UserError(f"reward_preview: {message}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """CONFIG, --prompts N (1-64), --completions K (1-64), --seed (default: training.seed)."""
    ap = _Args(prog="python -m trainer.worker.probes.reward_preview", add_help=True)
    ap.add_argument("config")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--completions", type=int, default=4)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args(argv)
    for name in ("prompts", "completions"):
        if not 1 <= getattr(args, name) <= 64:
            raise UserError(f"--{name}: give a number from 1 to 64 (got {getattr(args, name)})")
    return args


def main(argv: list[str] | None = None) -> int:
    """Print the preview's JSON (exit 0), or one line on stderr (exit 2 for bad input)."""
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        try:
            cfg = config_mod.load(args.config)
        except config_mod.ConfigError as exc:
            raise UserError("; ".join(f"{k}: {m}" if k else m for k, m in exc.problems)) from None
        records = prompts_mod.read_prompt_records(cfg.data.path, cfg.rewards.answer_field, cfg.data.format,
                                                  cfg.data.skip_bad_lines)[: args.prompts]
        rewards = rewards_mod.reward_functions(cfg)
        doc = preview(cfg, records, rewards, args.completions, cfg.training.seed if args.seed is None else args.seed)
    except UserError as exc:
        print(secrets.redact(str(exc)).replace("\n", " "), file=sys.stderr)
        return EXIT_BAD_INPUT
    print(json.dumps(doc, ensure_ascii=False))
    sys.stdout.flush()
    return 0


def preview(cfg, records: list[dict], rewards: list, completions: int, seed: int) -> dict:
    """Sample ``completions`` answers to each record's prompt with the base model and score them."""
    import torch

    from trainer.worker.generate import generation
    from trainer.worker.loading import modeling

    started = time.perf_counter()
    generation.quiet_libraries()
    use_cuda = cfg.device != "cpu" and torch.cuda.is_available()
    tok = modeling.load_tokenizer(cfg)
    model = generation.base_model(cfg, use_cuda)
    model.eval()
    torch.manual_seed(seed)
    shown = []
    for record in records:
        prompt = grpo_prompts.render(tok, record["prompt"], cfg.grpo.system_prompt, "a record", cfg.data.system_message)
        ids = grpo_prompts.prompt_ids(tok, prompt)
        answers = _sample(model, tok, ids, completions, cfg.grpo)
        texts = [a["text"] for a in answers]
        conversational = isinstance(prompt, list)
        columns = {k: [v] * completions for k, v in record.items() if k != "prompt"}
        scored = rewards_mod.score(
            rewards, [prompt] * completions,
            [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts,
            completion_ids=[a["ids"] for a in answers],
            columns=columns)
        shown.append({
            "prompt": grpo_prompts.prompt_text(tok, prompt),
            "reference": record.get(cfg.rewards.answer_field),
            "completions": [{"text": a["text"], "tokens": len(a["ids"]), "stopped": a["stopped"],
                             "rewards": {r.name: scored["rewards"][r.name][i] for r in rewards},
                             "total": scored["total"][i]} for i, a in enumerate(answers)],
        })
    return {"model": cfg.model.source or cfg.model.architecture, "chat_template": bool(getattr(tok, "chat_template", None)),
            "functions": [{"name": r.name, "weight": r.weight, "builtin": r.builtin} for r in rewards],
            "prompts": shown, "seconds": round(time.perf_counter() - started, 2)}


def _sample(model, tok, ids: list[int], n: int, g) -> list[dict]:
    """``n`` sampled completions of ``ids`` (one batch): ``{"text", "ids", "stopped"}`` each, the stop token left out."""
    import torch

    from trainer.worker.generate.generation import stop_ids

    stops = stop_ids(tok, model)
    device = next(model.parameters()).device
    input_ids = torch.tensor([ids] * n, dtype=torch.long, device=device)
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=True,
                             temperature=g.temperature, top_p=g.top_p, top_k=g.top_k,
                             max_new_tokens=g.max_completion_length, eos_token_id=stops or None,
                             pad_token_id=tok.pad_token_id, use_cache=True)
    answers = []
    for row in out[:, len(ids):].tolist():
        cut = next((i for i, t in enumerate(row) if t in stops), None)
        kept = row if cut is None else row[:cut]
        answers.append({"text": tok.decode(kept, skip_special_tokens=True), "ids": kept,
                        "stopped": "max_length" if cut is None else "end_of_turn"})
    return answers


if __name__ == "__main__":
    sys.exit(main())
