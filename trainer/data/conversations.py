"""Chat rendering: which characters of a rendered conversation are trained (light: no torch).

The worker renders conversations with the tokenizer's own ``apply_chat_template`` (exactly what
inference renders); this module only needs a ``render(messages, add_generation_prompt) -> str``
callable. What is trained for assistant turn ``i`` is what the model must produce at inference for
that turn: the prompt is ``render(messages[:i], True)`` (the conversation so far and the assistant
header, as a chat front end sends it) and the answer is what ``render(messages[:i + 1], False)`` adds
after the longest common prefix with that prompt (its content, tool calls and end-of-turn), cut after
the first end-of-turn text (``stops``: the tokens generation stops at), where inference stops.

When every turn's prompt + answer is a prefix of the whole rendered conversation, the conversation is
one training example with every answer trained. Templates that rewrite history (Qwen3 and DeepSeek-R1
drop earlier turns' reasoning, Mistral Nemo moves the system text to the last user turn) render an
earlier turn differently once later turns exist: those conversations become one example per assistant
turn (its prompt as inference renders it, that answer trained), so no turn is trained on a context the
model never sees (docs/data.md).
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
Span = tuple[int, int]


def conversation_examples(messages: list[dict], render: Render, stops: tuple[str, ...] = (),
                          train_all: bool = False) -> list[tuple[str, list[Span]]]:
    """``[(rendered text, trained character spans)]``: one example, or one per assistant turn (module doc).

    ``stops`` are the end-of-turn texts generation stops at; with ``train_all`` the whole text is trained."""
    full = render(messages, False)
    if train_all:
        return [(full, [(0, len(full))])]
    turns = [assistant_turn(messages, i, render, stops) for i, m in enumerate(messages) if m.get("role") == "assistant"]
    turns = [(p, a) for p, a in turns if a]
    if all(full.startswith(p + a) for p, a in turns):
        return [(full, [(len(p), len(p) + len(a)) for p, a in turns])]
    return [(p + a, [(len(p), len(p) + len(a))]) for p, a in turns]


PROBE = "TRAINPILOT_CONTENT_PROBE_7F3A"  # stands in for a turn's content to find where the template puts it


def assistant_turn(messages: list[dict], i: int, render: Render, stops: tuple[str, ...] = ()) -> tuple[str, str]:
    """``(prompt, answer)`` of assistant turn ``i``: the prompt inference renders before it and the text the
    model must produce after that prompt (through the first end-of-turn in ``stops``).

    The answer starts where ``render(messages[:i + 1])`` leaves the prompt. Where the prompt re-renders
    context there (Mistral Nemo puts the system text into the last user turn, so it differs from the first
    character of that turn on), the answer starts after the part the prompt ends with too, but never past
    where the template puts the turn's content (found with a probe content)."""
    prompt = render(messages[:i], True)
    done = render(messages[: i + 1], False)
    k = common_prefix(prompt, done)
    tail = prompt[k:]
    if tail:
        try:
            probe = render(messages[:i] + [{**messages[i], "content": PROBE}], False)
        except Exception:  # a template that checks the content's shape: the overlap alone decides
            probe = done
        at = probe.find(PROBE)
        limit = common_prefix(probe, done) if at < 0 else min(at, common_prefix(probe, done))
        k += _overlap(tail, done, k, limit - k)
    return prompt, cut_after_stop(done[k:], stops)


def _overlap(tail: str, done: str, k: int, most: int) -> int:
    """The longest ``m <= most`` with ``done[k:k + m]`` a suffix of ``tail`` (characters; 0 when none)."""
    for m in range(min(most, len(tail)), 0, -1):
        if done[k + m - 1] == tail[-1] and tail.endswith(done[k:k + m]):
            return m
    return 0


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (characters)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # binary search with slice compares: C speed on long conversations
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def cut_after_stop(answer: str, stops: tuple[str, ...]) -> str:
    """``answer`` up to and including its first end-of-turn text (all of it when none occurs)."""
    ends = [answer.find(s) + len(s) for s in stops if s and s in answer]
    return answer[:min(ends)] if ends else answer


SYSTEM_PROBE = "TRAINPILOT_SYSTEM_PROBE_51C2"


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
    system = "\n\n".join(str(m.get("content") or "") for m in messages if m.get("role") == "system")
    rest = [m for m in messages if m.get("role") != "system"]
    if action == "dropped" or not system:
        return rest
    for i, m in enumerate(rest):
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            return rest[:i] + [{**m, "content": f"{system}\n\n{m['content']}"}] + rest[i + 1:]
    return [{"role": "user", "content": system}] + rest


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
