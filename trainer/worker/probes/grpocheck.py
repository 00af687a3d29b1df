"""``python -m trainer.worker.probes.grpocheck CONFIG``: can this GRPO run start? Checked before anything is written.

The supervisor's preflight runs this child for ``training.objective: grpo`` (it may not import the user's reward
file, nor a tokenizer, itself):
- the rewards build: built-in patterns compile, the ``rewards.python`` file imports and each public function takes
  TRL's keyword call (``load_python_rewards``);
- every reward is called once on completions made from the first records, as TRL calls it, so a function that
  returns the wrong number of values, or text, fails here with one message (``dry_run``);
- every prompt, rendered as the worker will render it (the chat template with the generation prompt, or plain
  text), leaves ``grpo.max_completion_length`` tokens of ``data.seq_len``; a longer one is refused naming its line
  (or counted and skipped by the worker when ``data.skip_bad_lines``).
Exit 0 printing ``records prompts_too_long longest_prompt_tokens``, or 2 with the message on stderr.
"""
from __future__ import annotations

import sys

from trainer import config as config_mod
from trainer.core import secrets
from trainer.core.errors import EXIT_BAD_INPUT, UserError
from trainer.data import prompts as prompts_mod
from trainer.data import token_stats
from trainer.data import rewards as rewards_mod
from trainer.worker.datapipe import grpo_prompts


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when the run's rewards and prompts are usable, else 2 with the message on stderr."""
    args = sys.argv[1:] if argv is None else argv
    cfg = config_mod.load(args[0])
    try:
        prompt_file = _read(cfg)  # the records' shape first: no tokenizer needed
        rewards = rewards_mod.reward_functions(cfg)
        found = grpo_prompts.measure(cfg, _tokenizer(cfg), prompt_file)
        # the prompts as TRL receives them (messages under a chat template): completions come back in the same form
        rewards_mod.dry_run(rewards, found.rows, cfg.rewards.answer_field)
        too_long, longest = len(found.too_long), max(found.lengths, default=0)
        _store_longest(cfg, found)
    except UserError as exc:
        print(secrets.redact(str(exc)), file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"{len(found.rows) + too_long} {too_long} {longest}")
    return 0


def _store_longest(cfg, found) -> None:
    """Cache the longest prompt for the planner (``token_stats``: the update is planned at it + the completion).
    Prompts longer than this seq_len leaves are not measured past that room: the entry then says "longer than the
    room", so a later, longer seq_len (same cache entry) plans at its full length rather than too short."""
    if not found.lengths:
        return
    longest = max(found.lengths) if not found.too_long else cfg.data.seq_len - cfg.grpo.max_completion_length + 1
    token_stats.store(cfg, {"longest_prompt": int(longest), "records": len(found.rows) + len(found.too_long)})


def _read(cfg) -> prompts_mod.PromptFile:
    d = cfg.data
    return prompts_mod.read_prompt_file(d.path, cfg.rewards.answer_field, d.format, d.skip_bad_lines)


def _tokenizer(cfg):
    from trainer.worker.loading import modeling

    return modeling.load_tokenizer(cfg)


def _tokenizer_check(tokenizer, cfg) -> dict:
    from trainer.worker.loading import tokenizer_check

    return tokenizer_check.report(tokenizer, cfg)


def report(cfg, examples: int = 3) -> dict:
    """``trainpilot-cli data`` for a GRPO run: the prompt records, their shape, prompt token statistics with the run's
    tokenizer (rendered as the worker renders them) and the first prompts with their references."""
    prompt_file = _read(cfg)
    tokenizer = _tokenizer(cfg)
    found = grpo_prompts.measure(cfg, tokenizer, prompt_file, refuse_too_long=False)  # counted here, not refused
    counts = sorted(found.lengths) or [0]
    _store_longest(cfg, found)
    shown = [{"prompt": grpo_prompts.prompt_text(tokenizer, r["prompt"]), "reference": r[cfg.rewards.answer_field]}
             for r in found.rows[:examples]]
    return {"source": str(cfg.data.path), "format": prompt_file.shape or "prompt", "records": len(found.rows) + len(found.too_long), "answer_field": cfg.rewards.answer_field,
            "chat_template": bool(getattr(tokenizer, "chat_template", None)),
            "prompt_tokens": {"median": counts[len(counts) // 2], "p95": counts[min(len(counts) - 1, int(0.95 * len(counts)))],
                              "max": counts[-1]},
            "prompt_room": cfg.data.seq_len - cfg.grpo.max_completion_length, "too_long": len(found.too_long),
            "too_long_where": found.too_long[:20],
            "completions_per_prompt": cfg.grpo.num_generations, "max_completion_length": cfg.grpo.max_completion_length,
            "examples": shown, "tokenizer": _tokenizer_check(tokenizer, cfg)}


if __name__ == "__main__":
    sys.exit(main())
