"""The Data page's words and HTML (no Qt): which objectives can train a detected record format, the
token statistics of a ``trainpilot-cli data --json`` report, and its rendered examples with prompt and
answer kept apart and a legend for what is trained and what is masked."""
from __future__ import annotations

import html
import json
import math
import re

from trainer.config.sections import DataConfig
from trainer.data.conversations import rendering_notes
from trainer.data.formats import PAIR_FORMATS, TRAINABLE_FORMATS
from trainer.data.preference import KTO_FIELDS, OBJECTIVE_FIELDS, PAIR_FIELDS
from trainer.data.prompts import PROMPT_SHAPES  # detect_prompt_shape's answers: prompts with references

TRAINED_STYLE = "background:#d7f5d0;color:#111"    # trained text: highlighted
PICTURE_STYLE = "color:#555;font-size:small"        # a picture's caption (read, never trained)
PICTURE_URL = "picture:{index}"                      # the examples' thumbnails, as document resources (page_data)
MASKED_STYLE = "color:#999"                          # masked (read as context, not trained): greyed
REJECTED_STYLE = "background:#f8d7d3;color:#111"   # a preference pair's rejected answer (pushed down)
OBJECTIVE_WORDS = {
    "sft": "SFT — learn to write the answers (next-token loss)",
    "dpo": "DPO — prefer the chosen answer over the rejected one (a frozen reference model)",
    "orpo": "ORPO — prefer the chosen answer, no reference model (less memory)",
    "kto": "KTO — learn from answers labelled desirable or undesirable",
    "grpo": "GRPO — sample answers, score them with rewards, learn from the better ones",
}
SKIP_LABEL = "Skip unreadable lines"  # the Data page's data.skip_bad_lines


# A data.* config key (the schema's fields only, never a file name like "…/data.jsonl").
_DATA_KEY = re.compile(r"(?<![\w/\\.-])data\.(" + "|".join(sorted(DataConfig.model_fields, key=len, reverse=True))
                       + r")\b")
WHERE_ADVANCED = " (Method page → Advanced settings)"


def data_words(text: str) -> str:
    """A data error in the Data page's words: "data.path: " is the field above it, so it goes; the unreadable-lines
    switch is the check box on the page; any other data.* key by the label Advanced settings gives it (where, once)."""
    text = re.sub(r"^data\.path: ", "", text.strip())
    text = re.sub(r"(?:set )?data\.skip_bad_lines: true", f"tick “{SKIP_LABEL}”", text)
    text = text.replace("point data.path at", "choose")
    said: set[str] = set()

    def name(m: re.Match) -> str:
        label = f"“{m.group(1).replace('_', ' ').capitalize()}”"
        first = not said
        said.add(label)
        return label + (WHERE_ADVANCED if first else "")
    return _DATA_KEY.sub(name, text)


def objectives_for(record_format: str | None) -> tuple[str, ...]:
    """The ``training.objective`` values that read ``record_format`` records (() when unknown)."""
    if record_format == "preference":
        return tuple(o for o, f in OBJECTIVE_FIELDS.items() if f == PAIR_FIELDS)
    if record_format == "kto":
        return tuple(o for o, f in OBJECTIVE_FIELDS.items() if f == KTO_FIELDS)
    if record_format in PROMPT_SHAPES:  # prompts with reference answers are also a prompt and its answer
        return ("sft", "grpo")
    return ("sft",) if record_format in TRAINABLE_FORMATS else ()


def needs_choice(record_format: str | None) -> bool:
    """True for records no supervised default trains (pairs, KTO, prompts with references): the user picks."""
    return record_format in PAIR_FORMATS or record_format in PROMPT_SHAPES


def is_pair_format(record_format: str | None) -> bool:
    """True for preference pairs and KTO records (trained by preference objectives, not SFT)."""
    return record_format in PAIR_FORMATS


def legend_html(pairs: bool) -> str:
    """What the colours of the rendered examples mean."""
    items = [(TRAINED_STYLE, "chosen answer: trained towards" if pairs else "trained"),
             (MASKED_STYLE, "prompt: read as context, not trained" if pairs else "masked: read, not trained")]
    if pairs:
        items.append((REJECTED_STYLE, "rejected answer: trained away from"))
    return "Colours: " + " · ".join(f"<span style='{s}'>&nbsp;{html.escape(t)}&nbsp;</span>" for s, t in items)


def examples_html(examples: list[dict], thumbnails: dict | None = None) -> str:
    """Rendered examples as HTML, after a legend: trained segments highlighted, masked ones greyed
    (whitespace kept); a picture where it is in the turn, as the thumbnail ``thumbnails`` names for its path
    (``{path: (resource url, caption)}``; without one, a placeholder line), with its image tokens; a preference or
    KTO example shows its prompt and answers as separate blocks."""
    pairs = any("rejected" in ex or "label" in ex for ex in examples)
    blocks = [f"<p>{legend_html(pairs)}</p>"] if examples else []
    for i, ex in enumerate(examples, 1):
        tokens = f" ({ex['tokens']:,} tokens)" if isinstance(ex.get("tokens"), int) else ""
        blocks.append(f"<p><b>Example {i}</b>{tokens}</p>")
        blocks.append(_pair_html(ex) if "rejected" in ex or "label" in ex else _pre(ex["segments"], thumbnails or {}))
    return "".join(blocks)


def picture_paths(examples: list[dict]) -> list[str]:
    """The pictures of rendered examples (their segments' ``image`` paths), in order, each once."""
    return list(dict.fromkeys(s["image"] for ex in examples for s in ex.get("segments", []) if s.get("image")))


def _pre(segments: list[dict], thumbnails: dict) -> str:
    spans = "".join(_picture_html(s, thumbnails.get(s["image"])) if s.get("image") else
                    f"<span style='{TRAINED_STYLE if s['trained'] else MASKED_STYLE}'>{html.escape(s['text'])}</span>"
                    for s in segments)
    return f"<pre style='white-space:pre-wrap'>{spans}</pre>"


def _picture_html(segment: dict, thumb) -> str:
    """One picture of a rendered turn: its thumbnail (or why there is none) and a caption with its file name and
    image tokens, on lines of its own."""
    name = html.escape(segment["image"].replace("\\", "/").rsplit("/", 1)[-1])
    tokens = segment.get("tokens")
    what = f"{name} · {tokens:,} image tokens, read, not trained" if isinstance(tokens, int) else f"{name} · read, not trained"
    if thumb is None:
        return f"\n<span style='{PICTURE_STYLE}'>[picture: {what}]</span>\n"
    url, caption = thumb
    if url is None:  # no preview: the reason (missing, not a picture, too large to preview)
        return f"\n<span style='{PICTURE_STYLE}'>[picture: {what} — {html.escape(caption)}]</span>\n"
    note = f" — {html.escape(caption)}" if caption else ""
    return f"\n<img src='{url}'>\n<span style='{PICTURE_STYLE}'>{what}{note}</span>\n"


def _block(title: str, text: str, style: str) -> str:
    return (f"<p style='margin:4px 0 0 0'><i>{title}</i></p><pre style='white-space:pre-wrap;margin-top:0'>"
            f"<span style='{style}'>{html.escape(text)}</span></pre>")


def _pair_html(ex: dict) -> str:
    """Prompt, then the answer(s), each in its own block with its own colour."""
    prompt = "".join(s["text"] for s in ex["segments"] if not s["trained"])
    answer = "".join(s["text"] for s in ex["segments"] if s["trained"])
    out = _block("prompt", prompt, MASKED_STYLE)
    if "rejected" in ex:
        return out + _block("chosen", answer, TRAINED_STYLE) + _block("rejected", ex["rejected"], REJECTED_STYLE)
    label = "desirable" if ex["label"] else "undesirable"
    return out + _block(f"completion — labelled {label}", answer, TRAINED_STYLE if ex["label"] else REJECTED_STYLE)


def report_summary(r: dict) -> str:
    """Token statistics in one HTML paragraph (a pair's tokens: the prompt with its longer answer), the pictures and
    their image tokens, then what the chat template does that shows only in the render (a folded system message, an
    empty reasoning block), in words."""
    notes = "".join(f"<br>⚠ {html.escape(n)}" for n in rendering_notes(r))
    return _token_summary(r) + pictures_summary(r) + notes


def pictures_summary(r: dict) -> str:
    """The report's image tokens in words ('' without pictures; the Data page's scan line counts the pictures): the
    tokens a picture takes, the most one sample's pictures take, and how pictures are sized (data.image_max_pixels)."""
    p = r.get("pictures") or {}
    if not p.get("pictures"):
        return ""
    each = f"each picture is {p['image_tokens_per_picture']:,} image tokens" if p.get("image_tokens_per_picture") \
        else "image tokens vary with the picture's size"
    out = f"<br><b>Pictures</b>: {each}"
    if p.get("image_tokens_max_per_sample"):
        out += f"; the most in one sample: {p['image_tokens_max_per_sample']:,}"
    out += " (counted in the tokens above; read, never trained)."
    if r.get("picture_sizes"):
        out += f"<br>{html.escape(r['picture_sizes'][:1].upper() + r['picture_sizes'][1:])}."
    return out


def _token_summary(r: dict) -> str:
    t = r["tokens"]
    pairs = is_pair_format(r.get("format"))
    what = "prompt + longer answer" if pairs else "record"
    packed = r["packing"] and not pairs  # preference training never packs
    return (f"Tokens per {what} (exact, this tokenizer): median {t['median']:,.0f}, p95 {t['p95']:,.0f}, "
            f"max {t['max']:,}.<br><b>{t['truncated_fraction']:.1%}</b> of records are longer than seq_len "
            f"{r['seq_len']} ({'continued in the next packed block' if packed else 'cut'}); "
            f"{t['per_epoch']:,} tokens per epoch"
            + (f", {t['trained']:,} trained." if t.get("trained") is not None else "."))


def grpo_report_summary(r: dict) -> str:
    """A GRPO data report's prompt statistics (``trainpilot-cli data --json`` for training.objective grpo)."""
    t = r["prompt_tokens"]
    too_long = (f"<b style='color:#b00'>{r['too_long']:,} prompts are longer</b> than" if r["too_long"] else
                "every prompt fits in")
    return (f"Prompt tokens (exact, this tokenizer{', chat template' if r['chat_template'] else ', plain text'}): "
            f"median {t['median']:,}, p95 {t['p95']:,}, max {t['max']:,}.<br>{too_long[0].upper() + too_long[1:]} the "
            f"{r['prompt_room']:,} tokens data.seq_len leaves beside grpo.max_completion_length "
            f"{r['max_completion_length']:,}.<br>"
            f"{r['completions_per_prompt']} completions are sampled per prompt and scored by the rewards (next page).")


def grpo_examples_html(examples: list[dict]) -> str:
    """The first prompts as the model sees them, each with its reference answer."""
    blocks = []
    for i, ex in enumerate(examples, 1):
        blocks.append(f"<p><b>Prompt {i}</b> (reference answer: <b>{html.escape(str(ex['reference']))}</b>)</p>")
        blocks.append(f"<pre style='white-space:pre-wrap'><span style='{MASKED_STYLE}'>{html.escape(ex['prompt'])}"
                      "</span></pre>")
    return "".join(blocks)


def scan_pictures(s) -> str:
    """The light scan's picture count in words ('' for data without pictures)."""
    p = getattr(s, "pictures", None) or {}
    if not p.get("pictures"):
        return ""
    where = "" if p["records_with_pictures"] == getattr(s, "records", None) else \
        f" in {p['records_with_pictures']:,} of them"
    return f", <b>{p['pictures']:,} pictures</b>{where} (at most {p['max_per_record']} in one record)"


def cell_text(value) -> str:
    """A record's field as the Records tab shows it: text as is, everything else as JSON (as in the file, never a
    Python repr: ``true``/``null`` and double quotes)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


MIN_BAR_SHARE = 1 / 60  # of the plotted width: the bars of one token on a 0…2048 axis would be invisible
MIN_ONE_BAR = 1 / 150  # of the plotted width, each bar at least (~4 px on the page): finer bins are merged


def histogram_bars(edges: list[float], counts: list[int],
                   seq_len: int) -> tuple[list[float], list[float], list[int], float]:
    """(left edges, right edges, heights, right end of the x axis) of the token-length bars. The axis runs from 0
    past both the longest record and seq_len; adjacent bins narrower than MIN_ONE_BAR of it are merged (40 bins of
    records 10-200 tokens long on a 0…2,150 axis were 1-px slivers), and bars that together span less than
    MIN_BAR_SHARE (records of one or a few lengths) are spread about their centre to that width, in their order
    (visible, none over another)."""
    right = max(edges[-1], seq_len) * 1.05 or 1.0
    width = (edges[-1] - edges[0]) / max(1, len(counts))
    k = max(1, math.ceil(right * MIN_ONE_BAR / width)) if width > 0 else 1
    if k > 1:
        counts = [sum(counts[i:i + k]) for i in range(0, len(counts), k)]
        edges = edges[:-1:k] + [edges[-1]]
    span, centre = edges[-1] - edges[0], (edges[0] + edges[-1]) / 2
    scale = max(1.0, right * MIN_BAR_SHARE / span) if span > 0 else 1.0
    scaled = [centre + (e - centre) * scale for e in edges]
    return scaled[:-1], scaled[1:], list(counts), right
