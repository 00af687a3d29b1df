"""Worker side of ``trainpilot-cli data``: the detected format, the true record count, exact token
statistics with the real tokenizer, and the first examples rendered as trained/masked segments.

Trainable formats are tokenized by the same process and into the same cache as training
(``trainer.worker.datapipe.producer``: the packed chunks and, beside each, every record's token counts), so the
run that follows starts on a complete cache and a second report is instant; preference/KTO records
are rendered here.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from trainer.data import conversations, formats, token_stats
from trainer.data.conversations import segments
from trainer.data.pictures import PictureCount
from trainer.worker.datapipe import blocks
from trainer.worker.loading import modeling, tokenizer_check
from trainer.worker.datapipe import pipeline
from trainer.worker.datapipe import producer
from trainer.worker.datapipe import rendering, sequences
from trainer.worker.datapipe import vision_inputs as vision
from trainer.worker.datapipe.rendering import (
    Encoder,
    clean_messages,
    set_chat_template,
    rows_of,
)

HISTOGRAM_BINS = 30


def report(cfg, examples: int = 3, on_examples=None) -> dict:
    """The report as a JSON-able dict (see docs/data.md for the fields). Raises UserError for bad data.
    ``on_examples(examples)``, when given, gets the rendered examples as soon as they are known: before every record
    is tokenized (seconds, where the statistics of 400,000 records take minutes)."""
    tokenizer = modeling.load_tokenizer(cfg)
    src, raw = pipeline.open_source(cfg, "train", lazy=not cfg.data.hub_dataset)  # a file: read by index below
    had_template = bool(getattr(tokenizer, "chat_template", None))
    pictures = vision.pictures_for(cfg, tokenizer)  # a vision-language model's processor (adopts its template)
    from_processor = not had_template and bool(getattr(tokenizer, "chat_template", None))
    sequences.check_pictures(src, pictures, cfg)
    template = set_chat_template(tokenizer, cfg.data, src.record_format)
    if src.record_format in formats.PAIR_FORMATS:
        raw = raw if raw is not None else pipeline.load_file(Path(src.where), src.kind, cfg.data, src=src)
        head = rows_of(raw[: max(examples, 0)]) if examples else []
        shown = _pair_examples(tokenizer, head, src)
        _ = on_examples and on_examples(shown)
        (lengths, parts), trained, seen = _pair_stats(tokenizer, raw, src.record_format), None, {}
    else:
        reader = producer.record_reader(cfg, "train")[1] if raw is None else producer.ArrowRows(raw)
        head = rows_of(reader.batch(range(min(max(examples, 0), len(reader))))) if examples else []
        rendering.check_roles(tokenizer, src, cfg.data)
        enc = Encoder(cfg, tokenizer, src.record_format, src.where, pictures, columns=src.has_pictures)
        shown = [_example(enc, tokenizer, rec, i, cfg) for i, rec in enumerate(head)]
        _ = on_examples and on_examples(shown)
        (lengths, trained, seen), parts = _lengths(cfg, tokenizer, src, pictures), {}
    counted = {**PictureCount(**src.pictures).as_dict(), **_picture_tokens(seen)}
    if len(lengths):  # the planner's plan follows the data from now on (trainer.data.token_stats)
        token_stats.store(cfg, {"longest": int(lengths.max()), "records": int(len(lengths)), **parts,
                                **({"pictures": counted} if counted.get("pictures") else {})})
    return {
        "format": src.record_format, "format_description": formats.describe(src.record_format),
        "source": src.where, "records": src.records if src.records is not None else len(lengths),
        "skipped_lines": len(src.skipped_lines) + len(src.skipped_records), "seq_len": cfg.data.seq_len, "packing": cfg.data.packing and not src.has_pictures,
        "tokens": _stats(lengths, trained, cfg.data.seq_len),
        "histogram": _histogram(lengths),
        "chat_template": None if template is None else ("config" if cfg.data.chat_template else
                                                        "processor" if from_processor else
                                                        "tokenizer" if had_template else "default"),
        "system_message": _system_message(tokenizer, src, cfg.data),
        "empty_think_block": _empty_think_block(src, head, shown),
        "pictures": counted,
        "picture_sizes": pictures.cap_words if pictures is not None and src.has_pictures else None,
        "examples": shown,
        "tokenizer": tokenizer_check.report(tokenizer, cfg),
    }


def _picture_tokens(seen: dict) -> dict:
    """``image_tokens_per_picture`` (the tokens every picture takes, when they all take the same; null when they vary
    with the picture's size, or there are none) and ``image_tokens_max_per_sample`` (the most any sequence's pictures
    take), from the tokenized data's per-record picture columns."""
    import numpy as np

    if not seen or not len(seen["pictures"]) or not seen["pictures"].any():
        return {"image_tokens_per_picture": None, "image_tokens_max_per_sample": None}
    has = seen["pictures"] > 0
    low, high = int(seen["low"][has].min()), int(seen["high"][has].max())
    return {"image_tokens_per_picture": low if low == high else None,
            "image_tokens_max_per_sample": int(np.max(seen["tokens"]))}


EMPTY_THINK = re.compile(r"<think>\s*</think>")


def _empty_think_block(src, head: list[dict], shown: list[dict]) -> bool | None:
    """True when the chat template writes an empty reasoning block (``<think></think>``, Qwen3's templates) into the
    trained answers the records do not have themselves; None for formats without a chat template."""
    if src.record_format not in formats.CONVERSATION_FORMATS:
        return None
    own = any("<think>" in json.dumps(rec, ensure_ascii=False) for rec in head)
    return not own and any(s["trained"] and EMPTY_THINK.search(s["text"]) for ex in shown for s in ex["segments"])


def _system_message(tokenizer, src, d) -> dict | None:
    """What ``data.system_message`` does to this data: ``setting``, ``template_has_system_role`` and
    ``action`` (none: no record has one; kept, merged into the first user turn, dropped, refused)."""
    if src.record_format not in formats.CONVERSATION_FORMATS:
        return None
    chat = conversations.for_tokenizer(tokenizer, d.system_message)
    has = any("system" in roles for roles, _where in src.roles)
    return {"setting": d.system_message, "template_has_system_role": chat.takes_system,
            "action": chat.system_action([{"role": "system"}] if has else [])}


PICTURE_COLUMNS = {"pictures": "pictures", "tokens": "picture_tokens", "low": "picture_tokens_min",
                   "high": "picture_tokens_max"}


def _lengths(cfg, tokenizer, src, pictures=None):
    """Tokens per record (every record, training order), the trained tokens in all, and — data with pictures — per
    record its pictures and their tokens (``PICTURE_COLUMNS``), from the lengths the tokenizing process writes beside
    each chunk (it runs to the end here; cached for the run)."""
    import numpy as np

    parts, _ = blocks.open_data(cfg, tokenizer, src, "train", True, pictures)
    tokens, trained, seen = [], 0, {key: [] for key in PICTURE_COLUMNS}
    for name, part in parts.items():
        part.total()  # waits for the whole part
        for k in range(part.done()["chunks"]):
            t = producer.read_table(producer.lengths_file(part.folder, name, k))
            tokens.append(t.column("tokens").to_numpy().astype(np.int64))
            trained += int(t.column("trained").to_numpy().sum())
            if "pictures" in t.column_names:
                for key, column in PICTURE_COLUMNS.items():
                    seen[key].append(t.column(column).to_numpy().astype(np.int64))
    seen = {key: np.concatenate(v) for key, v in seen.items() if v}
    return (np.concatenate(tokens) if tokens else np.zeros(0, np.int64)), trained, seen


def _stats(lengths, trained: int | None, seq_len: int) -> dict:
    import numpy as np

    if len(lengths) == 0:
        return {"median": 0, "p95": 0, "max": 0, "mean": 0.0, "truncated_fraction": 0.0, "total": 0,
                "per_epoch": 0, "trained": trained}
    total = int(lengths.sum())
    return {"median": float(np.median(lengths)), "p95": float(np.percentile(lengths, 95)), "max": int(lengths.max()),
            "mean": float(lengths.mean()), "truncated_fraction": float((lengths > seq_len).mean()), "total": total,
            "per_epoch": total, "trained": trained}


def _histogram(lengths) -> dict:
    import numpy as np

    if len(lengths) == 0:
        return {"edges": [0, 1], "counts": [0]}
    counts, edges = np.histogram(lengths, bins=min(HISTOGRAM_BINS, max(1, int(lengths.max() - lengths.min()) + 1)))
    return {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]}


def _example(enc: Encoder, tokenizer, rec: dict, index: int, cfg) -> dict:
    """One shown record: its ``segments``, ``tokens`` and ``training_examples`` (a conversation whose template
    rewrites history is trained as one example per assistant turn: their segments follow one another)."""
    d, fmt, n = cfg.data, enc.fmt, 1
    if fmt in formats.CONVERSATION_FORMATS and enc.columns:
        examples = enc.render_pictures(rec, index)
        parts = [p for ex, held, _ in examples for p in enc.pictures.segments(segments(ex.text, ex.spans), held)]
        return {"segments": [p for p in parts if p.get("text") or "image" in p], "training_examples": len(examples),
                "tokens": sum(len(ex.ids) for ex, _, _ in examples)}
    if fmt in formats.CONVERSATION_FORMATS:
        examples = enc.render(rec, index)
        parts, n = [p for ex in examples for p in segments(ex.text, ex.spans)], len(examples)
    elif fmt in ("template", "prompt_completion"):  # prompt_completion: the fields are the templates' halves
        prompt_t, answer_t = (d.prompt_template, d.response_template) if fmt == "template" else ("{prompt}", "{completion}")
        prompt, answer = prompt_t.format(**rec), answer_t.format(**rec) + (tokenizer.eos_token or "")
        parts = [{"text": prompt, "trained": d.train_on_prompt}, {"text": answer, "trained": True}]
    else:
        value = rec.get(d.text_field)
        parts = [{"text": (value if isinstance(value, str) else "" if value is None else str(value))
                  + (tokenizer.eos_token or ""), "trained": True}]
    text = "".join(p["text"] for p in parts)
    return {"segments": [p for p in parts if p["text"]], "tokens": len(tokenizer(text, add_special_tokens=False)["input_ids"]),
            "training_examples": n}


def _pair_text(tokenizer, value, prompt: bool) -> str:
    if isinstance(value, list):
        msgs = clean_messages([dict(m) for m in value])
        if prompt:
            return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) if msgs else ""
        return "".join(str(m.get("content") or "") for m in msgs) + (tokenizer.eos_token or "")
    return str(value) + ("" if prompt else (tokenizer.eos_token or ""))


def _normalised(rec: dict, fmt: str) -> dict:
    return formats.to_preference(rec) if fmt == "preference" else formats.to_kto(rec)


def _pair_stats(tokenizer, raw, fmt: str):
    """Tokens of prompt + the longer answer (chosen/rejected) or prompt + completion, every record; and the longest
    prompt and the longest answer alone (``longest_prompt``, ``longest_completion``: KTO's KL pairs mix them)."""
    import numpy as np

    out, prompt_max, answer_max = [], 0, 0
    for batch in raw.iter(batch_size=1000):
        for rec in rows_of(batch):
            r = _normalised(rec, fmt)
            answers = [r["chosen"], r["rejected"]] if fmt == "preference" else [r["completion"]]
            prompt = _pair_text(tokenizer, r["prompt"], True)
            texts = [_pair_text(tokenizer, a, False) for a in answers]
            ids = tokenizer([prompt + t for t in texts] + [prompt] + texts, add_special_tokens=False)["input_ids"]
            out.append(max(len(x) for x in ids[: len(texts)]))
            prompt_max = max(prompt_max, len(ids[len(texts)]))
            answer_max = max([answer_max] + [len(x) for x in ids[len(texts) + 1:]])
    return np.array(out, dtype=np.int64), {"longest_prompt": prompt_max, "longest_completion": answer_max}


def _pair_examples(tokenizer, head: list[dict], src) -> list[dict]:
    """Shown preference/KTO records: prompt and answer apart, and ``tokens`` counted as the statistics count
    them (the prompt with its longer answer), so an example's number matches the histogram's."""
    shown = []
    for rec in head:
        r = _normalised(rec, src.record_format)
        prompt = _pair_text(tokenizer, r["prompt"], True)
        answers = [r["chosen"], r["rejected"]] if src.record_format == "preference" else [r["completion"]]
        texts = [_pair_text(tokenizer, a, False) for a in answers]
        tokens = max(len(ids) for ids in tokenizer([prompt + a for a in texts], add_special_tokens=False)["input_ids"])
        item = {"segments": [{"text": prompt, "trained": False}, {"text": texts[0], "trained": True}],
                "tokens": tokens, "record": json.loads(json.dumps(r, default=str))}
        if src.record_format == "preference":
            item["rejected"] = texts[1]
        else:
            item["label"] = r["label"]
        shown.append(item)
    return shown
