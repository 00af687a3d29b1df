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
from trainer.data import rewards as rewards_mod
from trainer.data.preference import _line_numbers
from trainer.data.readers import read_records


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when the run's rewards and prompts are usable, else 2 with the message on stderr."""
    args = sys.argv[1:] if argv is None else argv
    cfg = config_mod.load(args[0])
    try:
        records = prompts_mod.read_prompt_records(cfg.data.path, cfg.rewards.answer_field, cfg.data.format,
                                                  cfg.data.skip_bad_lines)
        rewards = rewards_mod.reward_functions(cfg)
        rewards_mod.dry_run(rewards, records, cfg.rewards.answer_field)
        too_long, longest = check_prompt_lengths(cfg, records)
    except UserError as exc:
        print(secrets.redact(str(exc)), file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"{len(records)} {too_long} {longest}")
    return 0


def rendered_prompts(tokenizer, records: list[dict], system_prompt: str | None) -> list:
    """The prompts as the worker hands them to TRL: message lists when the tokenizer has a chat template (plain text
    becomes one user turn, ``system_prompt`` first), plain text otherwise. UserError for message prompts without a
    template."""
    template = bool(getattr(tokenizer, "chat_template", None))
    out = []
    for r in records:
        if template:
            out.append(prompts_mod.as_messages(r["prompt"], system_prompt))
        elif isinstance(r["prompt"], list):
            raise UserError("data.path: the prompts are message lists but the tokenizer has no chat template; use a "
                            "model whose tokenizer has one (or set data.chat_template), or give the prompts as text",
                            field="data.path")
        else:
            out.append(r["prompt"])
    return out


def prompt_token_counts(tokenizer, prompts: list) -> list[int]:
    """Tokens of each prompt the way TRL tokenizes it (``_tokenize_prompts``): the chat template with the generation
    prompt for message lists, the tokenizer's own special tokens for text."""
    counts = []
    for p in prompts:
        if isinstance(p, list):
            ids = tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=True)
            counts.append(len(ids["input_ids"]))
        else:
            counts.append(len(tokenizer(text=p)["input_ids"]))
    return counts


def check_prompt_lengths(cfg, records: list[dict]) -> tuple[int, int]:
    """(prompts too long, longest prompt in tokens); UserError at the first too-long prompt unless
    ``data.skip_bad_lines`` (the worker then leaves them out and says how many)."""
    from trainer.worker.loading import modeling

    tokenizer = modeling.load_tokenizer(cfg)
    counts = prompt_token_counts(tokenizer, rendered_prompts(tokenizer, records, cfg.grpo.system_prompt))
    room = cfg.data.seq_len - cfg.grpo.max_completion_length
    over = [i for i, n in enumerate(counts) if n > room]
    if over and not cfg.data.skip_bad_lines:
        i = over[0]
        records_read = read_records(cfg.data.path, cfg.data.format, cfg.data.skip_bad_lines)
        raise UserError(f"data.path: {records_read.path} {_line_numbers(records_read)[i]}: the prompt is {counts[i]} tokens, but "
                        f"data.seq_len {cfg.data.seq_len} - grpo.max_completion_length {cfg.grpo.max_completion_length} "
                        f"leaves {room} for it ({len(over)} prompt(s) too long); raise data.seq_len, lower "
                        f"grpo.max_completion_length, or set data.skip_bad_lines: true to leave them out",
                        field="data.path")
    if len(over) == len(records):
        raise UserError(f"data.path: every prompt of {cfg.data.path} is longer than the {room} tokens data.seq_len "
                        f"leaves beside grpo.max_completion_length; raise data.seq_len", field="data.path")
    return len(over), max(counts, default=0)


def report(cfg, examples: int = 3) -> dict:
    """``trainpilot-cli data`` for a GRPO run: the prompt records, their shape, prompt token statistics with the run's
    tokenizer (rendered as the worker renders them) and the first prompts with their references."""
    from trainer.worker.loading import modeling

    records = prompts_mod.read_prompt_records(cfg.data.path, cfg.rewards.answer_field, cfg.data.format,
                                              cfg.data.skip_bad_lines)
    raw = read_records(cfg.data.path, cfg.data.format, cfg.data.skip_bad_lines, limit=20).rows
    tokenizer = modeling.load_tokenizer(cfg)
    rendered = rendered_prompts(tokenizer, records, cfg.grpo.system_prompt)
    counts = sorted(prompt_token_counts(tokenizer, rendered))
    room = cfg.data.seq_len - cfg.grpo.max_completion_length
    shown = []
    for r, p in list(zip(records, rendered))[:examples]:
        text = tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) if isinstance(p, list) else p
        shown.append({"prompt": text, "reference": r[cfg.rewards.answer_field]})
    return {"source": str(cfg.data.path), "format": prompts_mod.detect_prompt_shape(raw, cfg.rewards.answer_field)
            or "prompt", "records": len(records), "answer_field": cfg.rewards.answer_field,
            "chat_template": bool(getattr(tokenizer, "chat_template", None)),
            "prompt_tokens": {"median": counts[len(counts) // 2], "p95": counts[min(len(counts) - 1, int(0.95 * len(counts)))],
                              "max": counts[-1]},
            "prompt_room": room, "too_long": sum(1 for n in counts if n > room),
            "completions_per_prompt": cfg.grpo.num_generations, "max_completion_length": cfg.grpo.max_completion_length,
            "examples": shown}


if __name__ == "__main__":
    sys.exit(main())
