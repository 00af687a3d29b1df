"""Preference (DPO/ORPO) and KTO records: read, check the shape against the objective. Light (no torch).

Shapes (issue 11's formats):
- pairs, for ``dpo`` and ``orpo``: ``{"prompt", "chosen", "rejected"}``; each plain text, or ``chosen`` and
  ``rejected`` as message lists (``[{"role": "assistant", "content": ...}]``) with ``prompt`` a message list too;
- KTO, for ``kto``: ``{"prompt", "completion", "label"}`` with ``label`` true (desirable) or false.

Every mismatch is a UserError naming the file, the line (JSONL) or record, the field and the fix.
"""
from __future__ import annotations

from pathlib import Path

from trainer.core.errors import UserError
from trainer.data.readers import Records, read_records

PAIR_FIELDS = ("prompt", "chosen", "rejected")
KTO_FIELDS = ("prompt", "completion", "label")
OBJECTIVE_FIELDS = {"dpo": PAIR_FIELDS, "orpo": PAIR_FIELDS, "kto": KTO_FIELDS}
_LIKE = {PAIR_FIELDS: "preference pairs (prompt, chosen, rejected): use training.objective dpo or orpo",
         KTO_FIELDS: "KTO records (prompt, completion, label): use training.objective kto"}


def read_preference_records(path: str, objective: str, fmt: str = "auto", skip_bad_lines: bool = False) -> list[dict]:
    """Records of ``path`` checked for ``objective`` (dpo, orpo, kto). Raises UserError on the first mismatch."""
    if objective not in OBJECTIVE_FIELDS:
        raise UserError(f"training.objective: '{objective}' does not read preference records; use dpo, orpo or kto",
                        field="training.objective")
    records = read_records(path, fmt, skip_bad_lines)
    lines = _line_numbers(records)
    want = OBJECTIVE_FIELDS[objective]
    for i, row in enumerate(records.rows):
        where = f"{records.path} {lines[i]}"
        missing = [f for f in want if f not in row or row[f] is None]
        if missing:
            raise UserError(_missing_message(where, row, missing, objective), field="data.path", path=str(records.path))
        _check_record(row, objective, where, records.path)
    return records.rows


def _line_numbers(records: Records) -> list[str]:
    """'line N' for JSONL records (blank and skipped lines accounted), else 'record N'."""
    p: Path = records.path
    n = len(records.rows)
    if p.suffix.lower() in (".jsonl", ".ndjson"):
        skipped = set(records.skipped_lines)
        text = p.read_text(encoding="utf-8-sig")
        nos = [no for no, line in enumerate(text.splitlines(), 1) if line.strip() and no not in skipped]
        if len(nos) >= n:
            return [f"line {no}" for no in nos[:n]]
    return [f"record {i + 1}" for i in range(n)]


def _missing_message(where: str, row: dict, missing: list[str], objective: str) -> str:
    present = ", ".join(sorted(row)) or "none"
    other = next((fields for fields in _LIKE if fields != OBJECTIVE_FIELDS[objective]
                  and all(f in row for f in fields)), None)
    if other:
        fix = f"these are {_LIKE[other]}"
    elif "text" in row or "messages" in row or "conversations" in row:
        fix = "this is supervised text, not preference data: use training.objective sft"
    else:
        fix = f"training.objective {objective} needs fields {', '.join(OBJECTIVE_FIELDS[objective])} in every record"
    return f"data.path: {where}: field '{missing[0]}' is missing (fields present: {present}); {fix}"


def _check_record(row: dict, objective: str, where: str, path: Path) -> None:
    def bad(field: str, why: str):
        raise UserError(f"data.path: {where}: field '{field}' {why}", field="data.path", path=str(path))

    texts = ("chosen", "rejected") if objective != "kto" else ("completion",)
    kinds = {f: _kind(row[f]) for f in ("prompt",) + texts}
    for f, kind in kinds.items():
        if kind is None:
            bad(f, f"must be text or a list of messages ({{\"role\", \"content\"}}), got {_json_kind(row[f])}")
        if kind == "messages":
            msg = _check_messages(row[f])
            if msg:
                bad(f, msg)
        elif not row[f].strip() and f != "prompt":
            bad(f, "is empty; give the answer text")
    if len({kinds[f] for f in texts} | ({kinds["prompt"]} if kinds["prompt"] == "messages" else set())) > 1 or \
            (kinds["prompt"] == "text" and any(kinds[f] == "messages" for f in texts)):
        bad(texts[0], "mixes plain text and message lists; use text for all of prompt/"
                      f"{'/'.join(texts)} or message lists for all")
    if objective == "kto" and not isinstance(row["label"], bool):
        bad("label", f"must be true (desirable) or false (undesirable), got {row['label']!r}")


def _kind(value) -> str | None:
    if isinstance(value, str):
        return "text"
    if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
        return "messages"
    return None


def _check_messages(messages: list[dict]) -> str | None:
    for j, m in enumerate(messages):
        if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return f"message {j + 1} needs a 'role' and a text 'content'"
    return None


def _json_kind(value) -> str:
    return {list: "an empty or mixed list", dict: "an object", int: "a number", float: "a number",
            bool: "true/false"}.get(type(value), type(value).__name__)

