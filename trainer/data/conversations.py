"""Chat rendering: which characters of a rendered conversation are trained (light: no torch).

The worker renders conversations with the tokenizer's own ``apply_chat_template`` (exactly what
inference renders); this module only needs a ``render(messages, add_generation_prompt) -> str``
callable. An assistant turn ``i`` is the text between ``render(messages[:i], True)`` (everything up
to and including the assistant header) and ``render(messages[:i + 1], False)`` (its content and its
end-of-turn token). Templates where a shorter conversation does not render as a prefix of the longer
one (some drop earlier "thinking" blocks) cannot be masked by turn: they are reported, not guessed.
"""
from __future__ import annotations

from typing import Callable

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

Render = Callable[[list, bool], str]


def assistant_spans(messages: list[dict], render: Render, train_all: bool = False) -> tuple[str, list[tuple[int, int]]]:
    """``(rendered text, [(start, end) character spans that are trained])``.

    Trained: every assistant turn's content and its end-of-turn text; with ``train_all`` the whole text.
    Raises ValueError when the template renders a conversation prefix differently (see module doc)."""
    full = render(messages, False)
    if train_all:
        return full, [(0, len(full))]
    spans = []
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        head = render(messages[:i], True) if i else render([], True)
        upto = render(messages[: i + 1], False)
        if not (full.startswith(upto) and upto.startswith(head)):
            raise ValueError("the chat template does not render a conversation's first turns as a prefix of the "
                             "whole conversation, so assistant turns cannot be located")
        if len(upto) > len(head):
            spans.append((len(head), len(upto)))
    return full, spans


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
