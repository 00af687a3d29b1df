"""GRPO prompt datasets: prompts with reference answers. Light (no torch): preflight, the GUI and the worker read them.

Shapes (``detect_prompt_shape``):
- ``prompt``: ``{"prompt": text or message list, <answer_field>: reference, ...}`` (``answer_field`` is
  ``rewards.answer_field``, "answer" by default);
- ``gsm8k``: ``{"question": text, "answer": "...worked solution...\\n#### 72"}`` (GSM8K and the many sets
  copied from it): the prompt is the question, the reference is what follows ``####`` ("72").

Every other field of a record is kept: TRL hands dataset columns to reward functions as keyword lists, so a
user's reward can read e.g. ``difficulty`` or ``test_cases``. Every mismatch is a UserError naming the file,
the line (JSONL) or record, the field and the fix.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from trainer.core.errors import UserError
from trainer.data.preference import _check_messages, _line_numbers
from trainer.data.readers import read_records

GSM8K_MARK = re.compile(r"####\s*(.+?)\s*$", re.S)
PROMPT_SHAPES = ("prompt", "gsm8k")


def detect_prompt_shape(rows: list[dict], answer_field: str = "answer") -> str | None:
    """"prompt", "gsm8k" or None (not a prompt dataset) from the first records' fields."""
    rows = [r for r in rows[:20] if isinstance(r, dict)]
    if not rows:
        return None
    if all("prompt" in r and answer_field in r for r in rows) and not any("chosen" in r or "completion" in r
                                                                          for r in rows):
        return "prompt"
    if all(isinstance(r.get("question"), str) and isinstance(r.get("answer"), str) and GSM8K_MARK.search(r["answer"])
           for r in rows):
        return "gsm8k"
    return None


def gsm8k_reference(answer: str) -> str | None:
    """The final answer of a GSM8K solution ('... #### 1,234' → '1234'); None without the '####' mark."""
    m = GSM8K_MARK.search(answer)
    return m.group(1).replace(",", "").strip() if m else None


@dataclass
class PromptFile:
    """A prompt file read once: its records, where each came from ("line 7", "record 3"), its shape and the
    unreadable lines ``skip_bad_lines`` skipped."""

    path: Path
    records: list[dict]
    places: list[str]
    shape: str | None
    skipped_lines: list[int] = field(default_factory=list)


def read_prompt_file(path: str, answer_field: str = "answer", fmt: str = "auto", skip_bad_lines: bool = False,
                     role: str = "data.path") -> PromptFile:
    """``path`` read and checked: records as ``{"prompt", answer_field, ...}``; UserError at the first record that is
    not a prompt with a reference answer. ``role`` names the config field in messages (data.path or
    data.validation_path)."""
    records = read_records(path, fmt, skip_bad_lines)
    if not records.rows:
        raise UserError(f"{role}: {records.path} holds no records; GRPO needs prompts with reference answers",
                        field=role, path=str(records.path))
    lines = _line_numbers(records)
    shape = detect_prompt_shape(records.rows, answer_field)
    out = [_prompt_record(row, shape, answer_field, f"{records.path} {lines[i]}", role, str(records.path))
           for i, row in enumerate(records.rows)]
    return PromptFile(records.path, out, lines, shape, list(records.skipped_lines))


def read_prompt_records(path: str, answer_field: str = "answer", fmt: str = "auto",
                        skip_bad_lines: bool = False, role: str = "data.path") -> list[dict]:
    """The checked records of ``path`` (``read_prompt_file``'s)."""
    return read_prompt_file(path, answer_field, fmt, skip_bad_lines, role).records


def _prompt_record(row: dict, shape: str | None, answer_field: str, where: str, role: str, path: str) -> dict:
    def bad(message: str):
        raise UserError(f"{role}: {where}: {message}", field=role, path=path)

    if not isinstance(row, dict):
        bad("is not a JSON object; each record needs 'prompt' and a reference answer")
    if shape == "gsm8k":
        ref = gsm8k_reference(row.get("answer") or "") if isinstance(row.get("answer"), str) else None
        if not isinstance(row.get("question"), str) or ref is None:
            bad("is not GSM8K-shaped like the first records (a 'question' and an 'answer' ending in '#### <final "
                "answer>'); fix or remove the record")
        rest = {k: v for k, v in row.items() if k not in ("question", "answer")}
        return {**rest, "prompt": row["question"], answer_field: ref, "solution": row["answer"]}
    present = ", ".join(sorted(row)) or "none"
    preference = "chosen" in row or "completion" in row
    if "prompt" not in row or row["prompt"] is None:
        fix = "GRPO reads a 'prompt' (text or messages) and a reference answer per record"
        bad(f"field 'prompt' is missing (fields present: {present}); {fix}")
    if answer_field not in row or row[answer_field] is None:
        fix = ("these are preference records: use training.objective dpo, orpo or kto" if preference else
               "add it to every record, or set rewards.answer_field to the field that holds it")
        bad(f"field '{answer_field}' (the reference answer, rewards.answer_field) is missing (fields present: "
            f"{present}); {fix}")
    prompt = row["prompt"]
    if isinstance(prompt, str):
        if not prompt.strip():
            bad("field 'prompt' is empty; give the question text")
    elif isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
        problem = _check_messages(prompt)
        if problem:
            bad(f"field 'prompt' {problem}")
        if prompt[-1].get("role") == "assistant":
            bad("field 'prompt' ends with an assistant message; the prompt ends with the user's turn (the model "
                "writes the answer)")
    else:
        bad("field 'prompt' must be text or a list of messages ({\"role\", \"content\"})")
    reference = row[answer_field]
    if isinstance(reference, (dict, list)):
        bad(f"field '{answer_field}' must be text or a number (the reference answer), got a "
            f"{'list' if isinstance(reference, list) else 'JSON object'}")
    return {**row, answer_field: str(reference).strip() if not isinstance(reference, bool) else str(reference).lower()}


def as_messages(prompt, system_prompt: str | None = None) -> list[dict]:
    """A prompt as chat messages: text becomes one user turn; ``system_prompt`` goes first unless the prompt already
    opens with a system message."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if system_prompt and not (messages and messages[0].get("role") == "system"):
        messages = [{"role": "system", "content": system_prompt}] + messages
    return messages
