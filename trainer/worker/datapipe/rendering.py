"""Worker side: records → token ids and labels, for every trainable record format.

Conversations (chat, ShareGPT, Alpaca) are rendered with the tokenizer's own chat template through
``apply_chat_template`` — the ids are exactly those inference would see — and labelled by the chat rules
(``trainer.data.conversations``: the system rule, the prompt/answer boundary on token ids, the end of turn;
one example, or one per assistant turn for templates that rewrite history). The text is tokenized without
the tokenizer's own special tokens, as ``apply_chat_template`` does at inference, so a template that writes
``bos_token`` never gets a second BOS. Plain text is ``bos + text + eos``; prompt/response templates as before.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from trainer.core.errors import UserError
from trainer.data import conversations, formats
from trainer.data import pictures as pictures_mod
from trainer.data.conversations import DEFAULT_CHAT_TEMPLATE, Example, SystemRefused, template_error
from trainer.data.scan import record_line
from trainer.models.sources import built_here, is_local

GENERATION_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")  # what transformers looks for (same regex)
JSON_COLUMN = "__record_json"  # records that Arrow cannot type (mixed shapes) travel as one JSON string


def set_chat_template(tokenizer, data_cfg, fmt: str) -> str | None:
    """Set the chat template conversations are rendered with: ``data.chat_template`` (text or a .jinja
    file), else the tokenizer's own, else TrainPilot's default. Returns the template (None for non-chat
    formats). The tokenizer is saved with the run, so the template travels with the trained model."""
    if fmt not in formats.CONVERSATION_FORMATS:
        return None
    wanted = data_cfg.chat_template
    if wanted:
        p = Path(wanted).expanduser()
        if wanted.endswith(".jinja") or (len(wanted) < 500 and "{" not in wanted):
            try:
                wanted = p.read_text(encoding="utf-8")
            except OSError as exc:
                raise UserError(f"data.chat_template: cannot read {p} ({exc.strerror}); give the template text or an "
                                f"existing .jinja file", field="data.chat_template", path=str(p)) from None
        tokenizer.chat_template = wanted
    elif not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE
    return tokenizer.chat_template


def check_roles(tokenizer, src, data_cfg) -> None:
    """Render one conversation of every distinct role sequence the scan found (``src.roles``) through
    the chat template, so a role or an order the template refuses is bad input before the first step,
    naming the first line that has it."""
    if src.record_format not in formats.CONVERSATION_FORMATS:
        return
    chat = conversations.for_tokenizer(tokenizer, data_cfg.system_message)
    for roles, where in src.roles:
        msgs = [{"role": r, "content": f"turn {i + 1}"} for i, r in enumerate(roles)]
        msgs = system_message(chat, msgs, src.where, where)
        try:
            chat.examples(msgs, data_cfg.train_on_prompt)
        except Exception as exc:  # jinja2's TemplateError (raise_exception in the template), TypeError, ...
            raise template_error(exc, src.where, where) from None


def renderer(tokenizer):
    """``render(messages, add_generation_prompt) -> text`` through the tokenizer's own chat template."""
    return lambda m, gen: tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=gen)


class _Line:
    """'line N' of a record, found only when a message says it (``record_line`` reads the file up to the record:
    computed for every record it made tokenizing quadratic in the file's length)."""

    __slots__ = ("path", "index")

    def __init__(self, path: str, index: int):
        self.path, self.index = path, index

    def __str__(self) -> str:
        return record_line(self.path, self.index)


def system_message(chat, msgs: list[dict], path: str, where: str) -> list[dict]:
    """``msgs`` after ``data.system_message`` (the chat rules' system rule); UserError naming the file and line
    (``where``) when the mode is 'error' and the template has no system role."""
    try:
        return chat.with_system(msgs)
    except SystemRefused:
        raise conversations.system_refused_error(path, where) from None


def chat_rules(tokenizer, cfg, pictures=None) -> "conversations.Chat":
    """The chat rules for this run's tokenizer: its template, ``data.system_message`` and the stop ids of the
    model's ``generation_config`` (``generation_eos_ids``); with ``pictures`` (``vision.Pictures``), rendered with
    each picture's image tokens and tokenized as the model's processor does."""
    if pictures is None:
        return conversations.for_tokenizer(tokenizer, cfg.data.system_message, generation_eos_ids(cfg))
    return conversations.for_tokenizer(tokenizer, cfg.data.system_message, generation_eos_ids(cfg),
                                       render=pictures.render(renderer(tokenizer)), encode=pictures.encode)


def rows_of(batch: dict) -> list[dict]:
    """The records of a column batch (decoding the JSON column when present)."""
    if JSON_COLUMN in batch:
        return [json.loads(s) for s in batch[JSON_COLUMN]]
    n = len(next(iter(batch.values())))
    return [{k: batch[k][i] for k in batch} for i in range(n)]


def clean_messages(msgs: list[dict]) -> list[dict]:
    """Turns without the null keys Arrow adds for fields other turns have (e.g. ``tool_calls: None``)."""
    return [{k: v for k, v in m.items() if v is not None or k == "content"} for m in msgs]


class Encoder:
    """Batched ``{"input_ids", "labels"}`` for one record format (labels -100 where not trained).
    ``where`` names the data (file or hub id) for error messages. ``pictures`` (``vision.Pictures``): a
    vision-language model's processor, whose way conversations are rendered and tokenized (with or without pictures);
    ``columns``: the data has pictures, so each sequence also carries ``images``, ``image_spans`` and
    ``picture_tokens``."""

    def __init__(self, cfg, tokenizer, fmt: str, where: str, pictures=None, columns: bool = False):
        self.d, self.tok, self.fmt, self.where = cfg.data, tokenizer, fmt, where
        eos = tokenizer.eos_token_id
        self.eos = [eos] if eos is not None else []
        self.bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None and tokenizer.bos_token_id != eos else []
        self.pictures = pictures if fmt in formats.CONVERSATION_FORMATS else None  # vision.Pictures
        self.columns = columns and self.pictures is not None  # data with pictures: their files and spans per sequence
        self.chat = chat_rules(tokenizer, cfg, self.pictures) if fmt in formats.CONVERSATION_FORMATS else None

    def __call__(self, batch: dict, indices: list[int]) -> dict:
        rows = rows_of(batch)
        if self.fmt == "text":
            ids = [self.bos + t + self.eos for t in self._encode([_as_text(r.get(self.d.text_field)) for r in rows])]
            return {"input_ids": ids, "labels": [list(x) for x in ids]}
        if self.fmt == "template":
            return self._templates(rows, self.d.prompt_template, self.d.response_template)
        if self.fmt == "prompt_completion":  # the fields are the templates' two halves
            return self._templates(rows, "{prompt}", "{completion}")
        if self.fmt in formats.CONVERSATION_FORMATS:
            return self._conversations(rows, indices)
        raise UserError(f"data.record_format: {self.fmt} records cannot be trained by supervised fine-tuning; "
                        f"preview them with 'trainpilot-cli data'", field="data.record_format")

    def _encode(self, texts: list[str]) -> list[list[int]]:
        return self.tok(texts, add_special_tokens=False)["input_ids"]

    def _templates(self, rows: list[dict], prompt_template: str, response_template: str) -> dict:
        d = self.d
        prompts = self._encode([prompt_template.format(**r) for r in rows])
        answers = self._encode([response_template.format(**r) for r in rows])
        ids, labels = [], []
        for p, a in zip(prompts, answers):
            ids.append(self.bos + p + a + self.eos)
            masked = [-100] * (len(self.bos) + len(p)) if not d.train_on_prompt else self.bos + p
            labels.append(masked + a + self.eos)
        return {"input_ids": ids, "labels": labels}

    def _conversations(self, rows: list[dict], indices: list[int]) -> dict:
        if not self.columns:
            examples = [ex for rec, index in zip(rows, indices) for ex in self.render(rec, index)]
            return {"input_ids": [ex.ids for ex in examples], "labels": [ex.labels for ex in examples]}
        out = {"input_ids": [], "labels": [], "images": [], "image_spans": [], "picture_tokens": []}
        for rec, index in zip(rows, indices):
            for ex, held, spans in self.render_pictures(rec, index):
                tokens = [self.pictures.expansion(p).tokens for p in held]
                for key, value in zip(out, (ex.ids, ex.labels, held, spans, tokens)):
                    out[key].append(value)
        return out

    def messages(self, rec: dict, index: int) -> list[dict]:
        """The record's conversation as the chat rules take it (content parts with absolute picture paths for a
        record with pictures). UserError naming the record."""
        problem = formats.check_record(rec, self.fmt, self.d.text_field)
        where = _Line(self.where, index)
        if problem:
            name, why = problem
            raise UserError(f"data.path: {self.where} {where}, field '{name}': {why}; fix or drop the record, or set "
                            f"data.record_format", field="data.path", path=self.where)
        if not pictures_mod.has_pictures(rec, self.fmt):
            return clean_messages(formats.to_messages(rec, self.fmt))
        if self.pictures is None:
            raise UserError(f"data.path: {self.where} {where} holds pictures, and the model takes none (it has no image "
                            f"processor); pick a vision-language model (SmolVLM, Qwen2.5-VL, Gemma 3, LLaVA...) or "
                            f"drop the pictures", field="data.path", path=self.where)
        try:
            return clean_messages(pictures_mod.normalise(rec, self.fmt, Path(self.where).parent))
        except pictures_mod.PictureProblem as exc:
            raise UserError(f"data.path: {self.where} {where}, field '{exc.field}': {exc.problem}; fix or drop the "
                            f"record", field="data.path", path=self.where) from None

    def render(self, rec: dict, index: int) -> list[Example]:
        """The training examples of one conversation record (one, or one per assistant turn; ``Chat.examples``).
        UserError naming the record."""
        where = _Line(self.where, index)
        msgs = system_message(self.chat, self.messages(rec, index), self.where, where)
        try:
            pictured = any(conversations.has_picture(m.get("content")) for m in msgs)
            marked = None if self.d.train_on_prompt or pictured else marker_example(self.tok, msgs, self.chat.stop_ids)
            return [marked] if marked else self.chat.examples(msgs, self.d.train_on_prompt)
        except UserError:
            raise
        except Exception as exc:  # jinja2's TemplateError (raise_exception in the template), TypeError, ...
            raise template_error(exc, self.where, where) from None

    def render_pictures(self, rec: dict, index: int) -> list[tuple[Example, list[str], list[int]]]:
        """``(example, its pictures, their image-token spans flattened)`` for each training example of a record."""
        examples = self.render(rec, index)
        paths = pictures_mod.pictures_of(self.messages(rec, index))
        try:
            return [(ex, *self.pictures.locate(ex.ids, paths)) for ex in examples]
        except ValueError as exc:
            raise template_error(exc, self.where, record_line(self.where, index)) from None


def marker_example(tokenizer, msgs: list[dict], stops=frozenset()) -> Example | None:
    """The example the template's own ``{% generation %}`` markers make (what its authors mark as the assistant's
    output; transformers' ``return_assistant_tokens_mask`` reads the same), or None when the template has none,
    marks a text other than what ``apply_chat_template`` renders, or marks answers without an end of turn among
    ``stops`` (LLaVA 1.5's: trained so, the model would never stop; the chat rules add EOS instead)."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or not GENERATION_MARKER.search(template):
        return None
    from transformers.utils.chat_template_utils import render_jinja_template
    rendered, indices = render_jinja_template(conversations=[msgs], chat_template=template,
                                              return_assistant_tokens_mask=True, **tokenizer.special_tokens_map)
    text = rendered[0]
    if text != tokenizer.apply_chat_template(msgs, tokenize=False):
        return None
    spans = [(int(a), int(b)) for a, b in indices[0]]
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    labels = token_labels(ids, enc["offset_mapping"], spans)
    if stops and not any(t in stops for t in labels):
        return None
    return Example(ids, labels, text, spans)


def generation_eos_ids(cfg) -> list[int]:
    """The model's ``generation_config.json`` ``eos_token_id`` (e.g. ``<|eot_id|>``, ``<|im_end|>``,
    ``<end_of_turn>``, ``<|end|>``), read from the local folder or cache only (the tokenizing process never
    downloads); [] without one."""
    source = cfg.model.source
    if built_here(cfg.model) and not (cfg.model.architecture and source and is_local(source)):
        return []  # shipped or random weights: no generation config (a local folder beside random weights is read)
    from transformers import GenerationConfig
    try:
        eos = GenerationConfig.from_pretrained(source, revision=cfg.model.revision, local_files_only=True).eos_token_id
    except (OSError, ValueError):
        return []  # no generation_config.json: the eos token alone
    return [int(i) for i in (eos if isinstance(eos, list) else [] if eos is None else [eos])]


def token_labels(ids: list[int], offsets: list, spans: list[tuple[int, int]]) -> list[int]:
    """Labels: the id where the token starts inside a trained character span, else -100."""
    out, k, spans = [], 0, sorted(spans)
    for tid, (start, _end) in zip(ids, offsets):
        while k < len(spans) and start >= spans[k][1]:
            k += 1
        out.append(tid if k < len(spans) and spans[k][0] <= start < spans[k][1] else -100)
    return out


def _as_text(v) -> str:
    return v if isinstance(v, str) else ("" if v is None else str(v))
