"""The chat rules, in one light module (no torch): how a conversation becomes what the model is trained on
and prompted with. SFT (``worker/datapipe/rendering``), DPO/KTO/ORPO (``worker/train/objectives``), GRPO
(``worker/datapipe/grpo_prompts``), chat (``worker/generate/generation``) and export (``worker/export``) all ask
here, through a ``Chat``: the chat template's render, the tokenizer's encode and the end-of-turn ids.

- **Content as the template reads it**: some templates render a turn's ``content`` only as text (Qwen2.5 prints a
  list of parts as Python text), others only as a list of ``{"type": "text"|"image", ...}`` parts (SmolVLM's and
  LLaVA's iterate over the parts and render nothing for a string). The rules probe the template once and give every
  turn the form it renders (``Chat.shape``): text where it takes text (a turn's text parts joined), parts otherwise
  and always for turns with pictures.
- **System messages** (``data.system_message``): kept where the template has a system role, merged into the
  first user turn where it has none (Gemma), merged, dropped, or refused ('error'), everywhere alike.
- **End of turn**: generation stops at EOS, the model's ``generation_config`` EOS ids and the known end-of-turn
  tokens the template writes (``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>``, ...); the *trained* end of turn
  is the first of them the template writes after an assistant's text (``Chat.end_of_turn_id``). A template that
  writes none after an answer (LLaVA 1.5's) gets the tokenizer's EOS trained after it, so the model still stops.
- **The prompt/answer boundary, on token ids**: for assistant turn ``i`` the prompt is
  ``render(messages[:i], add_generation_prompt=True)`` tokenized (exactly the ids inference sends) and the answer
  is what the tokenized ``render(messages[:i + 1])`` adds after the longest common prefix of *token ids* with it,
  cut after the first end-of-turn id. Comparing ids, never characters, a boundary can never fall inside a special
  token: Command R7B's prompt ends ``<|START_THINKING|><|END_THINKING|>`` where the rendered turn has
  ``<|START_RESPONSE|>``; a character compare cut ``<|START_`` off and trained ``RESPONSE|>`` as plain text.
- **One example or one per turn**: when every turn's prompt + answer ids are a prefix of the whole rendered
  conversation's ids, the conversation is one training example with every answer trained. Templates that rewrite
  history (Qwen3 and DeepSeek-R1 drop earlier turns' reasoning, Mistral Nemo moves the system text to the last
  user turn, Command R7B opens each answer after an empty thinking block) give one example per assistant turn,
  its prompt as inference renders it, so no turn is trained on a context the model never sees (docs/data.md).
- **The run's system prompt**: a system text every conversation shares is the default an exported model
  prompts with (the Modelfile's ``SYSTEM``).
"""
from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from trainer.core.errors import UserError

# The one default for tokenizers without a chat template (documented in docs/data.md). It is set on
# the tokenizer before training and saved with it (final/tokenizer_config.json or chat_template.jinja),
# so inference renders conversations exactly as training did. Every role is passed through, the end
# of each turn is the tokenizer's eos token (so generation stops there), and assistant tool calls are
# rendered as JSON.
DEFAULT_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' }}"
    "{%- if message['content'] is string %}{{ message['content'] }}{% endif %}"
    "{%- if message.get('tool_calls') %}{{ message['tool_calls'] | tojson }}{% endif %}"
    "{{ eos_token + '\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
# End-of-turn tokens of the common chat templates: stops wherever the vocabulary has them and the template writes them.
END_OF_TURN_TOKENS = ("<|return|>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|END_OF_TURN_TOKEN|>",
                      "<|end_of_text|>", "<|endoftext|>", "</s>", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
# gpt-oss's harmony format ends an answer with <|return|> (or <|call|>, a tool call: both its EOS ids); its <|end|>
# closes one message (the reasoning before the final answer), so it is no end of turn there: where the key token is
# in the template, the value is not a stop.
MESSAGE_ENDS = {"<|return|>": "<|end|>"}
MERGE_SEP = "\n\n"  # a system text merged into a user turn: system, blank line, user text
PROBE = "TRAINPILOT_CONTENT_PROBE_7F3A"  # stands in for a turn's content to find where the template puts it
SYSTEM_PROBE = "TRAINPILOT_SYSTEM_PROBE_51C2"
STRFTIME = re.compile(r"strftime_now\(\s*(['\"])(.*?)\1\s*\)")  # a template printing today's date, and its format
REASONING = re.compile(r"^\s*<think>.*?</think>\s*", re.S)  # a thinking model's reasoning block (Qwen3, DeepSeek-R1)

Render = Callable[[list, bool], str]  # (messages, add_generation_prompt) -> text
Encoded = tuple[list[int], Optional[list]]  # (token ids, character offsets or None)
Encode = Callable[[list[str]], list[Encoded]]  # texts -> each one tokenized without added special tokens
Span = tuple[int, int]


@dataclass(frozen=True)
class Turn:
    """One assistant turn: the prompt inference sends (ids and text) and the answer the model must write."""

    prompt: list[int]
    answer: list[int]
    prompt_text: str
    answer_text: str


@dataclass(frozen=True)
class Example:
    """One training sequence: ``ids``, ``labels`` (-100 where not trained), and the same as text with the
    trained character ``spans`` (for ``trainpilot-cli data``)."""

    ids: list[int]
    labels: list[int]
    text: str
    spans: list[Span]


class Chat:
    """A chat template and its tokenizer as the rules see them; ``system_mode`` is ``data.system_message``."""

    def __init__(self, render: Render, encode: Encode, stop_ids: Iterable[int] = (), system_mode: str = "auto",
                 decode: Callable[[list[int]], str] | None = None, eos: int | None = None):
        self.render, self.encode, self.decode, self.eos = render, encode, decode, eos
        self.stop_ids = frozenset(int(i) for i in stop_ids)
        self.system_mode = system_mode
        self._takes_system: bool | None = None
        self._forms: tuple[bool, bool] | None = None

    @property
    def takes_system(self) -> bool:
        """Whether the template renders a system message's text (Gemma's raises; some templates drop it)."""
        if self._takes_system is None:
            self._takes_system = template_takes_system(lambda m, gen: self.render(self.shape(m), gen))
        return self._takes_system

    @property
    def content_forms(self) -> tuple[bool, bool]:
        """``(renders text content, renders a list of parts)``: what the template does with a turn's content."""
        if self._forms is None:
            self._forms = content_forms(self.render)
        return self._forms

    def shape(self, messages: list[dict]) -> list[dict]:
        """``messages`` with each turn's content in the form the template renders (see the module docstring)."""
        text, parts = self.content_forms
        return [shape_content(m, text, parts) for m in messages]

    def system_action(self, messages: list[dict]) -> str:
        """What ``data.system_message`` does to ``messages`` (``system_action``)."""
        return system_action(messages, self.system_mode, self.takes_system)

    def with_system(self, messages: list[dict]) -> list[dict]:
        """``messages`` after the system rule; ``SystemRefused`` when the mode is 'error' and the template has none."""
        action = self.system_action(messages)
        if action == "refused":
            raise SystemRefused("the chat template has no system role and data.system_message is 'error'")
        return self.shape(with_system_message(messages, action))

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """The ids inference sends for ``messages`` (after the system rule): the template with its generation prompt."""
        return self.encode([self.render(self.with_system(messages), True)])[0][0]

    def turn(self, messages: list[dict], i: int) -> Turn:
        """Assistant turn ``i`` of ``messages`` (the system rule already applied): see the module docstring."""
        prompt_text, done_text = self.render(messages[:i], True), self.render(messages[: i + 1], False)
        (p, _), (d, offsets) = self.encode([prompt_text, done_text])
        k = common_prefix(p, d)
        if k < len(p):  # the prompt re-renders context (Mistral Nemo's system text): skip what it ends with too
            k += self._overlap(messages, i, p[k:], d, k, done_text)
        end = k + cut_after_stop(d[k:], self.stop_ids)
        answer, text = d[k:end], _text_of(done_text, offsets, k, end, d, self)
        if answer and self.eos is not None and not any(t in self.stop_ids for t in answer):
            # a template that ends no answer (LLaVA 1.5's): the model learns to stop with EOS, where generation stops
            answer, text = answer + [self.eos], text + (self.decode([self.eos]) if self.decode else "")
        return Turn(p, answer, prompt_text, text)

    def _overlap(self, messages: list[dict], i: int, tail: list[int], done: list[int], k: int, done_text: str) -> int:
        """The longest ``m`` with ``done[k:k + m]`` the end of the prompt's ``tail``, never past where the template
        puts the turn's content (found with a probe content)."""
        try:
            probe = self.render(messages[:i] + self.shape([{**messages[i], "content": PROBE}]), False)
        except Exception:  # noqa: BLE001 - a template that checks the content's shape: the overlap alone decides
            probe = done_text
        at = probe.find(PROBE)
        before = self.encode([probe[:at] if at >= 0 else probe])[0][0]
        most = min(common_prefix(before, done) - k, len(tail))
        for m in range(most, 0, -1):
            if done[k:k + m] == tail[-m:]:
                return m
        return 0

    def examples(self, messages: list[dict], train_all: bool = False) -> list[Example]:
        """The training examples of ``messages`` (system rule applied): one, or one per assistant turn."""
        full = self.render(messages, False)
        (ids, offsets), = self.encode([full])
        if train_all:
            return [Example(list(ids), list(ids), full, [(0, len(full))])]
        turns = [self.turn(messages, i) for i, m in enumerate(messages) if m.get("role") == "assistant"]
        turns = [t for t in turns if t.answer]
        if all(ids[:len(t.prompt) + len(t.answer)] == t.prompt + t.answer for t in turns):
            labels, spans = [-100] * len(ids), []
            for t in turns:
                a, b = len(t.prompt), len(t.prompt) + len(t.answer)
                labels[a:b] = ids[a:b]
                spans.append(_char_span(full, offsets, a, b, ids, self))
            return [Example(list(ids), labels, full, spans)]
        return [Example(t.prompt + t.answer, [-100] * len(t.prompt) + t.answer, t.prompt_text + t.answer_text,
                        [(len(t.prompt_text), len(t.prompt_text) + len(t.answer_text))]) for t in turns]

    def end_of_turn_id(self) -> int | None:
        """The end-of-turn id training taught: the first stop id the template writes after an assistant's text."""
        msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
        try:
            answer = self.turn(self.with_system(msgs), 1).answer
        except Exception:  # noqa: BLE001 - a template that renders no such conversation: no trained end of turn
            return None
        return next((t for t in answer if t in self.stop_ids), None)


class SystemRefused(ValueError):
    """A system message the chat template cannot take while ``data.system_message`` is 'error'."""


def for_tokenizer(tok, system_mode: str = "auto", eos_ids: Iterable[int] = (), render: Render | None = None,
                  encode: Encode | None = None) -> Chat:
    """A ``Chat`` over a Hugging Face tokenizer (duck-typed: ``apply_chat_template`` and ``__call__``); ``eos_ids``
    are the model's ``generation_config`` EOS ids. ``render``/``encode`` replace the tokenizer's own (a
    vision-language model's: pictures expanded, tokenized as its processor does)."""
    def own_render(messages, gen):
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)

    def own_encode(texts):
        try:
            enc = tok(list(texts), add_special_tokens=False, return_offsets_mapping=True)
            return list(zip(enc["input_ids"], enc["offset_mapping"]))
        except NotImplementedError:  # a slow (Python) tokenizer has no offsets
            return [(ids, None) for ids in tok(list(texts), add_special_tokens=False)["input_ids"]]

    return Chat(render or own_render, encode or own_encode, stop_ids(tok, eos_ids), system_mode,
                lambda ids: tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False),
                tok.eos_token_id if isinstance(tok.eos_token_id, int) else None)


def stop_ids(tok, eos_ids: Iterable[int] = ()) -> list[int]:
    """The ids generation stops at: EOS, ``eos_ids`` (the model's ``generation_config``) and the known end-of-turn
    tokens the tokenizer has and its chat template writes."""
    template = getattr(tok, "chat_template", None)
    template = template if isinstance(template, str) else ""
    ids = [tok.eos_token_id, *eos_ids]
    skip = {end for marker, end in MESSAGE_ENDS.items() if marker in template}
    for token in (t for t in END_OF_TURN_TOKENS if t not in skip):
        tid = tok.convert_tokens_to_ids(token) if token in template else None
        if isinstance(tid, int) and tid != getattr(tok, "unk_token_id", None) and tok.convert_ids_to_tokens(tid) == token:
            ids.append(tid)
    return sorted({int(i) for i in ids if isinstance(i, int)})


def common_prefix(a, b) -> int:
    """Length of the longest common prefix of two sequences (token ids or characters)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # binary search with slice compares: C speed on long conversations
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def cut_after_stop(answer: list[int], stops: frozenset[int]) -> int:
    """How many ids of ``answer`` are kept: through its first end-of-turn id (all of them when none occurs)."""
    return next((n + 1 for n, t in enumerate(answer) if t in stops), len(answer))


def _boundary(text: str, offsets, ids: list[int], j: int, chat: Chat) -> int:
    """The character where token ``j`` of ``text`` starts (tokens partition the text: the end of token ``j - 1``,
    so a space trimmed off a token's offsets stays with the token it belongs to)."""
    if j <= 0:
        return 0
    if j >= len(ids):
        return len(text)
    return offsets[j - 1][1] if offsets is not None else len(chat.decode(ids[:j]))


def _text_of(text: str, offsets, a: int, b: int, ids: list[int], chat: Chat) -> str:
    """The characters of tokens ``a:b`` of ``text``."""
    return text[_boundary(text, offsets, ids, a, chat):_boundary(text, offsets, ids, b, chat)] if a < b else ""


def _char_span(text: str, offsets, a: int, b: int, ids: list[int], chat: Chat) -> Span:
    return _boundary(text, offsets, ids, a, chat), _boundary(text, offsets, ids, b, chat)


def template_takes_system(render: Render) -> bool:
    """Whether the template renders a system message's text (Gemma's raises; some templates drop it)."""
    try:
        text = render([{"role": "system", "content": SYSTEM_PROBE}, {"role": "user", "content": "hi"}], True)
    except Exception:  # jinja2's TemplateError from raise_exception, or any template error on that role
        return False
    return SYSTEM_PROBE in text


def system_action(messages: list[dict], mode: str, takes_system: bool) -> str:
    """What ``data.system_message`` does to a conversation: ``none`` (no system message), ``kept``,
    ``merged`` (into the first user turn), ``dropped``, or ``refused`` (mode 'error', template without one)."""
    if not any(m.get("role") == "system" for m in messages):
        return "none"
    if mode == "drop":
        return "dropped"
    if mode == "merge" or (mode == "auto" and not takes_system):
        return "merged"
    return "kept" if takes_system else "refused"


def with_system_message(messages: list[dict], action: str) -> list[dict]:
    """``messages`` after ``system_action``: merged system text goes before the first user turn's text
    (separated by a blank line, what Gemma's authors do), or becomes that turn when there is none."""
    if action not in ("merged", "dropped"):
        return messages
    system = MERGE_SEP.join(plain_text(m.get("content")) for m in messages if m.get("role") == "system")
    rest = [m for m in messages if m.get("role") != "system"]
    if action == "dropped" or not system:
        return rest
    for i, m in enumerate(rest):
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            return rest[:i] + [{**m, "content": f"{system}{MERGE_SEP}{m['content']}"}] + rest[i + 1:]
        if m.get("role") == "user" and isinstance(m.get("content"), list):  # parts (pictures): a text part first
            merged = [{"type": "text", "text": f"{system}{MERGE_SEP}"}] + m["content"]
            return rest[:i] + [{**m, "content": merged}] + rest[i + 1:]
    return [{"role": "user", "content": system}] + rest


def plain_text(content) -> str:
    """A turn's content as text: a string as is, a list of parts its text parts joined (pictures left out)."""
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return "" if content is None else str(content)


def has_picture(content) -> bool:
    """Whether a turn's content (a list of parts) holds a picture."""
    return isinstance(content, list) and any(isinstance(p, dict) and p.get("type") in ("image", "image_url")
                                             for p in content)


def content_forms(render: Render) -> tuple[bool, bool]:
    """``(renders text, renders parts)``: whether the template prints a user turn's content given as a string, and
    given as a list of text parts (printing the list itself, as Python text, does not count). A template that
    renders neither probe is taken to render text (the form every text template reads)."""
    def shows(content) -> bool:
        try:
            out = render([{"role": "user", "content": content}], True)
        except Exception:  # noqa: BLE001 - a template that refuses this form of content
            return False
        return PROBE in out and "'type'" not in out and '"type"' not in out

    text, parts = shows(PROBE), shows([{"type": "text", "text": PROBE}])
    return (text or not parts), parts


def shape_content(message: dict, text: bool, parts: bool) -> dict:
    """One turn with its content as the template renders it: text when the template renders text and the turn has
    no picture (text parts joined), else a list of parts."""
    content = message.get("content")
    if isinstance(content, list):
        if text and not has_picture(content):
            return {**message, "content": plain_text(content)}
        return message
    if isinstance(content, str) and parts and not text:
        return {**message, "content": [{"type": "text", "text": content}]}
    return message


def prints_date(template: str | None) -> bool:
    """Whether a chat template prints today's date (``strftime_now``: Llama 3.x, Granite 3.x)."""
    return isinstance(template, str) and "strftime_now" in template


def pin_date(tok, date: str | None) -> None:
    """Make ``tok.apply_chat_template`` render ``strftime_now`` as ``date`` (YYYY-MM-DD, ``data.chat_date``): training,
    TRL's trainers, chat and export then print the run's date, not the day they happen to run. (transformers turns
    callables passed to a template into text, so the template itself is given the date: ``pinned_template``.)"""
    if not date or getattr(tok, "_trainpilot_date", None) == date:
        return
    apply = getattr(tok, "_trainpilot_apply", None) or tok.apply_chat_template

    def apply_chat_template(*args, **kwargs):
        template = kwargs.get("chat_template") or getattr(tok, "chat_template", None)
        if isinstance(template, str) and prints_date(template):
            kwargs["chat_template"] = pinned_template(template, date)
        return apply(*args, **kwargs)

    tok._trainpilot_apply, tok._trainpilot_date, tok.apply_chat_template = apply, date, apply_chat_template


def pinned_template(template: str, date: str) -> str:
    """``template`` with ``strftime_now`` defined in it as a macro that prints ``date`` in each format the template asks
    for: an exported model (llama.cpp, transformers) prompts with the date training used. Unchanged when it prints none."""
    formats = list(dict.fromkeys(m.group(2) for m in STRFTIME.finditer(template or "")))
    if not formats:
        return template
    when = datetime.date.fromisoformat(date)
    cases = "".join(f"{{%- {'if' if i == 0 else 'elif'} format == {_jinja_str(f)} -%}}{_jinja_lit(when.strftime(f))}"
                    for i, f in enumerate(formats))
    return (f"{{#- TrainPilot: this model was trained with the date {date} (data.chat_date); the template prints it "
            f"instead of today's -#}}\n{{%- macro strftime_now(format) -%}}{cases}{{%- else -%}}{_jinja_lit(date)}"
            f"{{%- endif -%}}{{%- endmacro -%}}\n" + template)


def _jinja_str(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _jinja_lit(text: str) -> str:
    return "{{ " + _jinja_str(text) + " }}"


def shared_system_prompt(conversations: Iterable[list[dict]]) -> str | None:
    """The system text every conversation opens with, when they all have the same one (None otherwise)."""
    found = None
    for messages in conversations:
        first = messages[0] if messages else {}
        text = first.get("content") if first.get("role") == "system" else None
        if not isinstance(text, str) or (found is not None and text != found):
            return None
        found = text
    return found


def answer_text(text: str) -> str:
    """A completion without a thinking model's leading ``<think>…</think>`` block: the answer itself."""
    return REASONING.sub("", text, count=1)


def segments(text: str, spans: list[tuple[int, int]]) -> list[dict]:
    """``text`` cut into ``{"text", "trained"}`` pieces, in order (they concatenate to ``text``)."""
    out, pos = [], 0
    for a, b in sorted(spans):
        if a > pos:
            out.append({"text": text[pos:a], "trained": False})
        if b > max(a, pos):
            out.append({"text": text[max(a, pos):b], "trained": True})
        pos = max(pos, b)
    if pos < len(text):
        out.append({"text": text[pos:], "trained": False})
    return out


def template_error(exc: Exception, path: str, where: str) -> UserError:
    """A UserError for a template that refused a record (e.g. an unsupported role); ``where`` is 'line N'."""
    msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return UserError(f"data.path: {path} {where}, field 'messages': the chat template refused this conversation "
                     f"({msg}); use roles the template knows (system/user/assistant), fix or drop the record, or "
                     f"set data.chat_template to a template that accepts it", field="data.path", path=path)


SYSTEM_ACTIONS = {"none": "no record has a system message", "kept": "system messages kept",
                  "merged": "system text put at the start of the first user turn", "dropped": "system messages dropped",
                  "refused": "system messages refused"}
THINK_WORDS = ("the chat template writes an empty reasoning block (<think></think>) before every answer, and it is "
               "trained with the answer: the model learns to answer without thinking first")


def system_line(s: dict) -> str:
    """One line on what data.system_message does to this data (a data report's ``system_message``)."""
    why = "the chat template has a system role" if s["template_has_system_role"] else "the chat template has no system role"
    return f"{SYSTEM_ACTIONS[s['action']]} ({why}; data.system_message: {s['setting']})"


def rendering_notes(report: dict) -> list[str]:
    """What the chat template does to the records that shows only in the rendered text, in words: a system message
    folded into the first user turn, dropped or refused (a template without a system role, e.g. Gemma's), and an
    empty reasoning block written into every answer (Qwen3's). For the data command's report (``--json``)."""
    out, s = [], report.get("system_message") or {}
    if s.get("action") in ("merged", "dropped", "refused"):
        out.append(f"{system_line(s)[:1].upper()}{system_line(s)[1:]}.")
    if report.get("empty_think_block"):
        out.append(f"{THINK_WORDS[:1].upper()}{THINK_WORDS[1:]}.")
    return out


def system_refused_error(path: str, where: str, field: str = "messages") -> UserError:
    """The UserError for a system message under ``data.system_message: error`` with a template that has no system role."""
    return UserError(f"data.path: {path} {where}, field '{field}': the chat template has no system role and "
                     f"data.system_message is 'error'; set data.system_message to 'merge' (the system text opens "
                     f"the first user turn) or 'drop', or remove the system message", field="data.system_message",
                     path=path)
