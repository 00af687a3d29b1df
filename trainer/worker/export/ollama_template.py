"""The chat template as Ollama's Go ``text/template``, rendering what the Jinja template renders.

Ollama never runs Jinja: it takes the Modelfile's ``TEMPLATE``. Rather than keep a table of
hand-written templates per family, we read the template's shape off its own renders
(``apply_chat_template``) of conversations whose texts are sentinels:

- the text before the first user turn without a system message (``head``: the default system
  prompt of Qwen2.5, Llama 3.1's "Cutting Knowledge Date" header), and around the system text
  when there is one (``system_prefix``/``system_suffix``);
- around each user and assistant turn, and the generation prompt after the last user turn;
- where the system text goes: at the top, into the last user turn (Mistral Nemo), nowhere (a run's
  own prompt template), or, for a template that refuses a system role (Gemma), into the first user
  turn as training merged it.

The shape is then rendered back in Python (``Shape.render``) and compared with the Jinja renders of
several conversations (with and without a system message, one to three turns, other texts); a
template the shape does not reproduce is refused before anything is written. ``go_template`` writes
the same shape as Go ``text/template`` over Ollama's ``.System``, ``.Messages`` (``.Role``,
``.Content``) and, for ``/api/generate``, ``.Prompt``/``.Response``. A leading BOS is left out when
the tokenizer adds it itself (llama.cpp and Ollama add it from the GGUF's ``add_bos_token``).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable

from trainer.core.errors import UserError
from trainer.data.conversations import MERGE_SEP, with_system_message

Render = Callable[[list, bool], str]  # (messages, add_generation_prompt) -> text
S, U1, A1, U2 = "SYSq7", "USRq1", "ASTq1", "USRq2"  # sentinels no template rewrites


@dataclasses.dataclass(frozen=True)
class Shape:
    """A chat template's literal pieces (see the module docstring); texts in characters."""

    head: str
    system_prefix: str
    system_suffix: str
    system_mode: str  # "top" | "last_user" | "first_user" | "drop"
    system_sep: str
    user_prefix: str
    user_suffix: str
    assistant_prefix: str
    assistant_suffix: str
    generation: str

    def render(self, messages: list[dict]) -> str:
        """What the Go template renders for ``messages`` (Ollama's chat: a generation prompt at the end)."""
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        out = [self.system_prefix + system + self.system_suffix if system and self.system_mode == "top" else self.head]
        turns = [m for m in messages if m["role"] in ("user", "assistant")]
        users = [i for i, m in enumerate(turns) if m["role"] == "user"]
        for i, m in enumerate(turns):
            if m["role"] == "assistant":
                out.append(self.assistant_prefix + m["content"] + self.assistant_suffix)
                continue
            merged = system and ((self.system_mode == "first_user" and i == users[0])
                                 or (self.system_mode == "last_user" and i == len(turns) - 1))
            out.append(self.user_prefix + (system + self.system_sep if merged else "") + m["content"] + self.user_suffix)
        return "".join(out) + self.generation


def _split(text: str, marks: list[str]) -> list[str] | None:
    """``text`` cut at each of ``marks`` in order: len(marks)+1 pieces; None if they are not there in order."""
    pieces, rest = [], text
    for mark in marks:
        if rest.count(mark) != 1:
            return None
        before, rest = rest.split(mark)
        pieces.append(before)
    return pieces + [rest]


def _whole_markers(prefix: str) -> str:
    """``prefix`` without a marker it ends inside: the text a user turn and the generation prompt share ends at
    ``<|CHATBOT_TOKEN|>``, not at ``<|START_`` (Command R7B's answer opens ``<|START_RESPONSE|>``, its generation
    prompt ``<|START_THINKING|>``), so every piece of the TEMPLATE holds whole special tokens."""
    for opening, closing in (("<", ">"), ("[", "]")):
        if prefix.rfind(opening) > prefix.rfind(closing):
            prefix = prefix[:prefix.rfind(opening)]
    return prefix


def _common_suffix(*texts: str) -> str:
    n = 0
    while all(len(t) > n for t in texts) and len({t[len(t) - n - 1] for t in texts}) == 1:
        n += 1
    return texts[0][len(texts[0]) - n:] if n else ""


def _system_layout(render: Render, plain: list[str], user_prefix: str) -> tuple[str, str, str, str] | None:
    """``(mode, prefix, suffix, sep)`` of the system text, from a render with a system message."""
    x0, x1, x2, x3 = plain
    convo = [{"role": "system", "content": S}, {"role": "user", "content": U1},
             {"role": "assistant", "content": A1}, {"role": "user", "content": U2}]
    try:
        text = render(convo, True)
    except Exception:  # noqa: BLE001 - the template refuses a system role (Gemma's raise_exception)
        return "first_user", "", "", MERGE_SEP
    if S not in text and text == x0 + U1 + x1 + A1 + x2 + U2 + x3:
        return "drop", "", "", ""  # the template has no place for a system text (a run's prompt template)
    top = _split(text, [S, U1, A1, U2])
    if top and top[1].endswith(user_prefix) and top[2:] == [x1, x2, x3]:
        return "top", top[0], top[1][:len(top[1]) - len(user_prefix)], ""
    last = _split(text, [U1, A1, S, U2])
    if last and last[0] == x0 and last[1] == x1 and last[2] == x2 and last[4] == x3:
        return "last_user", "", "", last[3]
    return None


def _boundary_rank(texts: tuple[str, ...], n: int) -> int:
    """How well a piece of the last ``n`` characters starts where a turn does (so the Modelfile reads
    ``<|im_start|>user``, not ``|>user``): 2 a marker (``<``/``[``) after a newline or a marker's end in
    every text, 1 any text after one, 0 otherwise."""
    if n == 0 or not all(len(t) > n and t[-n - 1] in "\n>]" for t in texts):
        return 0
    return 2 if all(t[-n] in "<[" for t in texts) else 1


def _user_prefix(rend: Render, plain: list[str]) -> tuple[str, tuple] | None:
    """The text before each user turn and the system layout that agrees with it: what follows the text
    that closes an assistant turn, else, of the common endings of the texts before the first and a
    later user turn, the longest at the best turn boundary."""
    common = _common_suffix(plain[0], plain[2])
    try:  # what closes an assistant turn, read off a conversation that ends with one
        tail = rend([{"role": "user", "content": U1}, {"role": "assistant", "content": A1}], False).split(A1)[-1]
    except Exception:  # noqa: BLE001 - a template that insists on ending with a user turn
        tail = ""
    closing = os.path.commonprefix([plain[2], tail])
    while closing and closing[-1] not in "\n>]":  # back to a marker's end: "<|end|>\n", not "<|end|>\n<|"
        closing = closing[:-1]
    if closing and common.endswith(plain[2][len(closing):]):
        layout = _system_layout(rend, plain, plain[2][len(closing):])
        if layout:
            return plain[2][len(closing):], layout
    best = None
    for n in range(len(common), -1, -1):
        rank = _boundary_rank((plain[0], plain[2]), n)
        if best is not None and rank <= best[0]:
            continue
        layout = _system_layout(rend, plain, common[len(common) - n:])
        if layout:
            best = (rank, common[len(common) - n:], layout)
            if rank == 2:
                break
    return best[1:] if best else None


def infer_shape(render: Render, bos: str | None = None) -> Shape | None:
    """The template's ``Shape`` read off its renders (``bos``: a leading text to leave out); None if it has none."""
    def strip(text: str) -> str:
        return text[len(bos):] if bos and text.startswith(bos) else text

    def rend(messages, gen):
        return strip(render(messages, gen))

    convo = [{"role": "user", "content": U1}, {"role": "assistant", "content": A1}, {"role": "user", "content": U2}]
    plain = _split(rend(convo, True), [U1, A1, U2])
    if plain is None:
        return None
    x0, x1, x2, x3 = plain
    user_suffix = _whole_markers(os.path.commonprefix([x1, x3]))
    found = _user_prefix(rend, plain)
    if found is None:
        return None
    user_prefix, layout = found
    mode, prefix, suffix, sep = layout
    return Shape(head=x0[:len(x0) - len(user_prefix)], system_prefix=prefix, system_suffix=suffix, system_mode=mode,
                 system_sep=sep, user_prefix=user_prefix, user_suffix=user_suffix,
                 assistant_prefix=x1[len(user_suffix):], assistant_suffix=x2[:len(x2) - len(user_prefix)],
                 generation=x3[len(user_suffix):])


def probe_conversations() -> list[list[dict]]:
    """Conversations the shape must reproduce: with/without system, one to three turns, ordinary texts."""
    sys_msg = {"role": "system", "content": "You are terse.\nAnswer in one line."}
    turns = [{"role": "user", "content": "What is 7 plus 3?"}, {"role": "assistant", "content": "7 plus 3 is 10."},
             {"role": "user", "content": "And 2 + 2?\nShow it."}, {"role": "assistant", "content": "4: 2 + 2 = 4"},
             {"role": "user", "content": "Merci, héllo 👋"}]
    return [turns[:1], [sys_msg, *turns[:1]], turns[:3], [sys_msg, *turns[:3]], turns, [sys_msg, *turns]]


def merge_system(messages: list[dict]) -> list[dict]:
    """``messages`` with a leading system text merged into the first user turn, as training merges it where the
    template refuses a system role (the chat rules' ``with_system_message``)."""
    return with_system_message(messages, "merged")


def merged_system(messages: list[dict], shape: Shape) -> list[dict]:
    """``messages`` as the Jinja template gets them for this shape (merged when it refuses a system role)."""
    return merge_system(messages) if shape.system_mode == "first_user" else messages


def checked_shape(render: Render, bos: str | None) -> Shape:
    """The template's shape, verified on ``probe_conversations``; UserError (exit 2) naming the first difference."""
    shape = infer_shape(render, bos)
    if shape is None:
        raise UserError("--ollama: the chat template's turns do not follow one pattern TrainPilot can write as an "
                        "Ollama TEMPLATE; export without --ollama and use the GGUF with llama.cpp (it runs the "
                        "Jinja template itself)", field="--ollama")
    for convo in probe_conversations():
        want = render(merged_system(convo, shape), True)
        want = want[len(bos):] if bos and want.startswith(bos) else want
        if shape.render(convo) != want:
            raise UserError(f"--ollama: an Ollama TEMPLATE would not render this conversation as the chat template "
                            f"does ({len(convo)} messages: {want!r}); export without --ollama and use the GGUF with "
                            f"llama.cpp", field="--ollama")
    return shape


def _lit(text: str) -> str:
    """Literal text for a Go template inside a Modelfile's triple quotes (no escapes there; Ollama keeps only
    printable characters, newlines and tabs)."""
    plain = all(c.isprintable() or c in "\n\t" for c in text)
    if plain and not any(s in text for s in ("{{", "}}", '"', "\r")):
        return text
    return "{{ " + json.dumps(text) + " }}"


def go_template(shape: Shape) -> str:
    """The Ollama ``TEMPLATE`` text for ``shape``: chat (``.Messages``) and generate (``.Prompt``) forms."""
    top = shape.system_mode == "top"
    head = (f"{{{{ if .System }}}}{_lit(shape.system_prefix)}{{{{ .System }}}}{_lit(shape.system_suffix)}"
            f"{{{{ else }}}}{_lit(shape.head)}{{{{ end }}}}" if top else _lit(shape.head))
    merge = {"first_user": "(not $seen)", "last_user": "(eq (len (slice $.Messages $i)) 1)"}.get(shape.system_mode)
    merged = f"{{{{ if and $.System {merge} }}}}{{{{ $.System }}}}{_lit(shape.system_sep)}{{{{ end }}}}" if merge else ""
    chat = (f"{{{{ $seen := false }}}}{{{{ range $i, $m := .Messages }}}}"
            f"{{{{ if eq .Role \"user\" }}}}{_lit(shape.user_prefix)}{merged}{{{{ .Content }}}}{_lit(shape.user_suffix)}"
            f"{{{{ $seen = true }}}}"
            f"{{{{ else if eq .Role \"assistant\" }}}}{_lit(shape.assistant_prefix)}{{{{ .Content }}}}"
            f"{_lit(shape.assistant_suffix)}{{{{ end }}}}{{{{ end }}}}{_lit(shape.generation)}")
    merged_prompt = f"{{{{ if .System }}}}{{{{ .System }}}}{_lit(shape.system_sep)}{{{{ end }}}}" if merge else ""
    legacy = (f"{{{{ if .Prompt }}}}{_lit(shape.user_prefix)}{merged_prompt}{{{{ .Prompt }}}}{_lit(shape.user_suffix)}"
              f"{{{{ end }}}}{_lit(shape.generation)}{{{{ .Response }}}}{{{{ if .Response }}}}"
              f"{_lit(shape.assistant_suffix)}{{{{ end }}}}")
    return f"{head}{{{{ if .Messages }}}}{chat}{{{{ else }}}}{legacy}{{{{ end }}}}"
