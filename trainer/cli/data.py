"""``trainpilot-cli data CONFIG [--json] [--examples N]``: what the run will train on.

The detected record format, the true record count, exact token statistics with the run's real
tokenizer (median, p95, max, share cut at seq_len, tokens per epoch), a token-length histogram and the
first examples rendered as ``segments`` of ``{"text", "trained"}``. The cheap checks run first (no
torch); the tokenizing part is the worker room's, imported only when those pass. Its tokenized data is
the same cache a run uses.
"""
from __future__ import annotations

import json
import sys

from trainer import config as config_mod
from trainer.core.errors import UserError
from trainer.data.conversations import THINK_WORDS, system_line
from trainer.supervisor import preflight


def register(sub) -> None:
    """Add the data command."""
    p = sub.add_parser("data", help="show the detected data format, token statistics and rendered examples")
    p.add_argument("config")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--examples", type=int, default=3, metavar="N", help="examples to render (default 3)")
    p.add_argument("--early-examples", action="store_true",
                   help="with --json: first print the rendered examples as one JSON line ({\"early_examples\": "
                        "[...]}) as soon as they are known, then the report (tokenizing every record takes longer)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    p.set_defaults(func=cmd_data)


def cmd_data(args) -> int:
    if args.examples < 0:
        raise UserError("--examples: give 0 or more examples to render")
    cfg = config_mod.load(args.config, args.overrides)
    offline = preflight.offline_unless_reachable(cfg)  # a look only: the cache answers at once, offline
    preflight.check_tokenizer_offline(cfg, offline)
    preflight.check_data(cfg)
    if cfg.training.objective == "grpo":  # prompts with references: their own report
        from trainer.worker.probes.grpocheck import report as grpo_report

        result = grpo_report(cfg, args.examples)
        print(json.dumps(result, ensure_ascii=False) if args.json else render_grpo_text(result))
        sys.stdout.flush()
        return 0
    # torch/transformers/datasets: imported only after the cheap checks passed
    from trainer.worker.probes.data_report import report

    result = report(cfg, args.examples, on_examples=_print_early if args.json and args.early_examples else None)
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
    else:
        print(render_text(result))
    sys.stdout.flush()
    return 0


def _print_early(examples: list[dict]) -> None:
    """The rendered examples as one JSON line, at once (the GUI shows them while the statistics are counted)."""
    print(json.dumps({"early_examples": examples}, ensure_ascii=False))
    sys.stdout.flush()


def render_grpo_text(r: dict) -> str:
    """A GRPO data report for a terminal: prompts as the model sees them, and their references."""
    t = r["prompt_tokens"]
    lines = [f"source:   {r['source']}",
             f"format:   {r['format']} — prompts with reference answers ('{r['answer_field']}') for GRPO",
             f"records:  {r['records']:,} prompts, {r['completions_per_prompt']} completions of up to "
             f"{r['max_completion_length']} tokens sampled for each",
             f"prompts:  median {t['median']:,} tokens, p95 {t['p95']:,}, max {t['max']:,}; room {r['prompt_room']:,} "
             f"(data.seq_len - grpo.max_completion_length); {r['too_long']} too long"]
    lines.append("template: the tokenizer's chat template (plain prompts become a user turn)" if r["chat_template"]
                 else "template: none (prompts are used as plain text)")
    if r.get("tokenizer"):
        lines.append(f"tokenizer: {r['tokenizer']['message']}")
    for i, ex in enumerate(r["examples"], 1):
        lines += [f"\n--- prompt {i} (reference: {ex['reference']}) ---", ex["prompt"]]
    return "\n".join(lines)


def picture_line(p: dict) -> str:
    """The pictures of a data report in words: how many, in how many records, and their image tokens."""
    per = p.get("image_tokens_per_picture")
    tokens = f"{per:,} image tokens each" if per is not None else "image tokens by size"
    most = p.get("image_tokens_max_per_sample")
    return (f"{p['pictures']:,} in {p['records_with_pictures']:,} records (at most {p['max_per_record']} in one); "
            f"{tokens}" + (f", at most {most:,} in one sample" if most is not None else ""))


def _segment_text(s: dict) -> str:
    """One rendered segment for a terminal: trained text as is, masked text and pictures in [brackets]."""
    if "image" in s:
        return f"[picture {s['image']}: {s['tokens']} tokens]"
    return s["text"] if s["trained"] else f"[{s['text']}]"


def render_text(r: dict) -> str:
    """The report for a terminal: trained text as is, masked text in [brackets]."""
    t = r["tokens"]
    lines = [f"source:   {r['source']}",
             f"format:   {r['format']} — {r['format_description']}",
             f"records:  {r['records']:,}" + (f" ({r['skipped_lines']} unreadable lines skipped)" if r["skipped_lines"] else ""),
             f"tokens:   median {t['median']:,.0f}, p95 {t['p95']:,.0f}, max {t['max']:,}; "
             f"{t['truncated_fraction']:.1%} longer than seq_len {r['seq_len']}"
             + (" (packed: continued in the next block)" if r["packing"] else " (cut)"),
             f"epoch:    {t['per_epoch']:,} tokens" + (f", {t['trained']:,} of them trained" if t.get("trained") is not None else "")]
    if (r.get("pictures") or {}).get("pictures"):
        lines.append(f"pictures: {picture_line(r['pictures'])}" + (f"; {r['picture_sizes']}" if r.get("picture_sizes") else ""))
    if r.get("chat_template"):
        lines.append(f"template: the {r['chat_template']} chat template")
    if r.get("system_message"):
        lines.append(f"system:   {system_line(r['system_message'])}")
    if r.get("empty_think_block"):
        lines.append(f"thinking: {THINK_WORDS}")
    if r.get("tokenizer"):
        lines.append(f"tokenizer: {r['tokenizer']['message']}")
    for i, ex in enumerate(r["examples"], 1):
        lines.append(f"\n--- example {i} ({ex.get('tokens', '?')} tokens; [masked] text is not trained) ---")
        if ex.get("training_examples", 1) > 1:
            lines.append(f"(trained as {ex['training_examples']} sequences, one per assistant turn, each with its "
                         f"context as the template renders it at inference: the template changes earlier turns "
                         f"once later ones exist)")
        lines.append("".join(_segment_text(s) for s in ex["segments"]))
        if "rejected" in ex:
            lines.append(f"--- rejected: {ex['rejected']}")
        if "label" in ex:
            lines.append(f"--- label: {'desirable' if ex['label'] else 'undesirable'}")
    return "\n".join(lines)
