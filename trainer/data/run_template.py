"""How a run's prompt/response templates turn a user message into the text training saw, and the
same rendering as a Jinja chat template to ship with an exported model. Light module (no torch).

A run trained on ``prompt_template`` + ``response_template`` saw ``bos + prompt + response + eos``,
the prompt and response tokenized separately. A chat turn fills the prompt template's first field
with the user's message (other fields empty) and appends the response template's text before its
first field (often nothing), so the model continues exactly where training taught it to answer.
A run trained on plain text (``text_field``) is a continuation model: the message is the text.
"""
from __future__ import annotations

import json
import string


def _split_at_first_field(template: str) -> tuple[str, str, list[str]]:
    """``(literal text before the first {field}, the rest, every field name)``."""
    before, fields, seen_field = [], [], False
    for literal, name, _spec, _conv in string.Formatter().parse(template):
        if not seen_field:
            before.append(literal)
        if name:
            fields.append(name)
            seen_field = True
    prefix = "".join(before)
    return prefix, template[len(prefix):], fields


def prompt_text(data_cfg, message: str) -> str:
    """The prompt part as training rendered it, with ``message`` in the prompt template's first field."""
    if data_cfg.prompt_template is None:
        return message
    _, _, fields = _split_at_first_field(data_cfg.prompt_template)
    values = {name: "" for name in fields}
    if fields:
        values[fields[0]] = message
    return data_cfg.prompt_template.format(**values)


def response_prefix(data_cfg) -> str:
    """Literal text the response template puts before the answer's first field (usually '')."""
    if data_cfg.response_template is None:
        return ""
    prefix, _, fields = _split_at_first_field(data_cfg.response_template)
    return prefix if fields else data_cfg.response_template


def chat_template(data_cfg, bos_token: str | None, eos_token: str | None) -> str:
    """A Jinja chat template that renders a conversation the way this run's data was rendered.

    ``bos_token``: None when training added none (no BOS, or BOS == EOS). Strings are embedded as
    JSON literals, which Jinja reads as string literals (quotes and newlines escaped)."""
    lit = json.dumps
    head = f"{{{{ {lit(bos_token)} }}}}" if bos_token else ""
    eos = f"{{{{ {lit(eos_token)} }}}}" if eos_token else ""
    if data_cfg.prompt_template is None:
        return (head + "{% for message in messages %}{{ message['content'] }}"
                "{% if message['role'] == 'assistant' %}" + eos + "{% endif %}{% endfor %}")
    before, after, answer = template_parts(data_cfg)
    return (head + "{% for message in messages %}{% if message['role'] == 'user' %}"
            f"{{{{ {lit(before)} }}}}{{{{ message['content'] }}}}{{{{ {lit(after)} }}}}"
            "{% elif message['role'] == 'assistant' %}{{ message['content'] }}" + eos + "{% endif %}{% endfor %}"
            f"{{% if add_generation_prompt %}}{{{{ {lit(answer)} }}}}{{% endif %}}")


def template_parts(data_cfg) -> tuple[str, str, str]:
    """``(text before the message, text after it, text that opens the answer)``: for Modelfile templates."""
    if data_cfg.prompt_template is None:
        return "", "", ""
    probe = "\x00MESSAGE\x00"
    rendered = prompt_text(data_cfg, probe)
    before, _, after = rendered.partition(probe)
    return before, after, response_prefix(data_cfg)
