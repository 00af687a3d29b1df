"""A run's own records, for an export: a few prompts to verify it on (validation records, else training records),
each with the token ids training gave that prompt, and the system prompt every record shares (the Modelfile's
``SYSTEM``). Read through the data pipeline's own readers, so a hub dataset or a million-line file costs what
training's first chunk costs."""
from __future__ import annotations

import json
import string
from dataclasses import dataclass

from trainer.core.errors import TrainPilotError
from trainer.data import formats, pictures
from trainer.data.conversations import Chat, SystemRefused, shared_system_prompt
from trainer.worker.datapipe import producer
from trainer.data.readers import read_records
from trainer.worker.datapipe.rendering import JSON_COLUMN, clean_messages, rows_of
from trainer.worker.generate import generation

CASES = 3  # prompts verified per export
SCAN_BATCH = 4096  # records read at a time when looking for a shared system prompt


@dataclass(frozen=True)
class Case:
    """One prompt: the messages a chat front end sends and the ids training gave that prompt."""

    messages: list  # after the chat rules' system rule, as training rendered them
    ids: list[int]
    where: str  # "validation record 3" / "training record 1"
    raw: list  # as the record has them (what a user sends Ollama, whose TEMPLATE applies the system rule itself)


def _reader(cfg, which: str):
    try:
        return producer.record_reader(cfg, which)
    except Exception:  # noqa: BLE001 - a format the SFT pipeline does not read (GRPO prompts): the records as they are
        path = cfg.data.validation_path if which == "validation" else cfg.data.path
        return None, _Records(read_records(path, cfg.data.format, True).rows)


class _Records:
    """A list of records with the readers' interface (``len``, ``batch``)."""

    def __init__(self, rows: list[dict]):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def batch(self, indices) -> dict:
        return {JSON_COLUMN: [json.dumps(self.rows[i]) for i in indices]}


def _indices(cfg, n: int, size: int) -> tuple[list[int], str]:
    if cfg.data.validation_path:
        return list(range(min(n, size))), "validation record"
    split = producer.held_out(cfg)
    if split > 0:
        held = list(producer.parts_of(size, cfg.training.seed, cfg.data.shuffle, split).get("eval", []))
        if held:
            return [int(i) for i in held[:n]], "validation record"
    return list(range(min(n, size))), "training record"


def _fmt(cfg, rows: list[dict]) -> str:
    if cfg.training.objective == "grpo":
        return "grpo"
    d = cfg.data
    return d.record_format if d.record_format != "auto" else formats.record_format_of(rows, d)


def messages_of(cfg, rec: dict, fmt: str) -> list[dict]:
    """The conversation a record stands for: its messages (chat formats), its prompt (preference, KTO, GRPO), or one
    user turn holding the text a chat sends in the prompt template's first field."""
    if fmt in formats.CONVERSATION_FORMATS:
        return clean_messages(formats.to_messages(rec, fmt))
    prompt = rec.get("prompt", rec.get("question"))
    if fmt == "grpo" or fmt in ("preference", "kto", "prompt_completion"):
        msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else clean_messages(list(prompt or []))
        if fmt == "grpo" and cfg.grpo.system_prompt and not (msgs and msgs[0]["role"] == "system"):
            msgs = [{"role": "system", "content": cfg.grpo.system_prompt}] + msgs
        return msgs
    if fmt == "template" and cfg.data.prompt_template:
        names = [n for _l, n, _s, _c in string.Formatter().parse(cfg.data.prompt_template) if n]
        return [{"role": "user", "content": str(rec.get(names[0], "")) if names else ""}]
    text = rec.get(cfg.data.text_field)
    return [{"role": "user", "content": (text if isinstance(text, str) else str(text or ""))[:400]}]


FALLBACK = [[{"role": "user", "content": "What is 7 plus 3?"}],
            [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "3+3?"}]]


def cases(cfg, tok, chat: Chat, n: int = CASES) -> list[Case]:
    """Up to ``n`` prompts of the run's own records with the ids training gave them (``Case``); when the run's data
    cannot be read any more (moved, deleted), fixed conversations rendered by the same rules, and said so."""
    try:
        found, pictured = _record_cases(cfg, tok, chat, n)
        if found or not pictured:
            return found
        why = "the run's records looked at all hold pictures, and the GGUF is the text model"
    except (OSError, TrainPilotError) as exc:
        why = f"the run's data cannot be read: {str(exc).splitlines()[0][:120]}"
    msgs = [chat.with_system(m) for m in FALLBACK]
    return [Case(m, chat.prompt_ids(m), f"a fixed prompt ({why})", m) for m in msgs]


def _record_cases(cfg, tok, chat: Chat, n: int) -> tuple[list[Case], int]:
    """The cases of the run's first records (validation records first), and how many were left out for their
    pictures."""
    which = "validation" if cfg.data.validation_path else "train"
    _src, reader = _reader(cfg, which)
    idx, label = _indices(cfg, n, len(reader))
    rows = rows_of(reader.batch(idx)) if idx else []
    fmt = _fmt(cfg, rows)
    out, pictured = [], 0
    for i, rec in zip(idx, rows):
        if pictures.has_pictures(rec, fmt):  # the GGUF is the text model: it is verified on text prompts
            pictured += 1
            continue
        raw = messages_of(cfg, rec, fmt)
        try:
            msgs = chat.with_system(raw)
        except SystemRefused:
            continue
        turns = [k for k, m in enumerate(msgs) if m.get("role") == "assistant"]
        if turns and getattr(tok, "chat_template", None):
            k = turns[-1]  # the last answer: its prompt holds the whole history
            raw_k = max(j for j, m in enumerate(raw) if m.get("role") == "assistant")
            out.append(Case(msgs[:k], chat.turn(msgs, k).prompt, f"{label} {i + 1}", raw[:raw_k]))
        elif msgs and msgs[-1].get("role") == "user":
            ids = (chat.prompt_ids(msgs) if len(msgs) > 1 else generation.prompt_ids(cfg, tok, msgs[0]["content"]))
            out.append(Case(msgs, ids, f"{label} {i + 1}", raw))
    return out, pictured


def shared_system(cfg) -> str | None:
    """The system prompt every training record opens with (conversations), or ``grpo.system_prompt``; else None (also
    when the run's data cannot be read any more)."""
    if cfg.training.objective == "grpo":
        return cfg.grpo.system_prompt or None
    try:
        return _scan_system(cfg)
    except (OSError, TrainPilotError):
        return None


def _scan_system(cfg) -> str | None:
    _src, reader = _reader(cfg, "train")
    size = len(reader)
    first = rows_of(reader.batch(list(range(min(20, size))))) if size else []
    fmt = _fmt(cfg, first) if first else None
    if fmt not in formats.CONVERSATION_FORMATS and fmt not in ("preference", "kto"):
        return None

    def conversations():
        for start in range(0, size, SCAN_BATCH):
            for rec in rows_of(reader.batch(list(range(start, min(size, start + SCAN_BATCH))))):
                yield messages_of(cfg, rec, fmt)
    return shared_system_prompt(conversations())
