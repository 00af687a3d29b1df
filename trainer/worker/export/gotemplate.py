"""Go's ``text/template`` in Python, for checking an Ollama ``Modelfile``'s ``TEMPLATE`` on a user's machine (no Go
there; Ollama renders with Go's own package, never Jinja).

The language as the Go documentation defines it, minus what Ollama templates never use: text and actions, trim
markers (``{{-`` / ``-}}`` remove all adjacent white space), comments, pipelines with ``|``, parenthesised pipelines,
variables (``$``, ``$x := …``, ``$x = …``, scoped to their control structure), fields and field chains on maps and
messages (``.Messages``, ``$.System``, ``.Role``), ``if``/``else if``/``else``, ``range`` (with ``$i, $m :=``,
``else``, ``break``, ``continue``), ``with``, literals (interpreted and raw strings, characters, numbers, booleans,
``nil``), Go's truthiness, and the functions ``and or not eq ne lt le gt ge len index slice print printf println``
plus Ollama's ``json``. ``len`` and ``slice`` count a string's UTF-8 bytes, as Go does. ``define``/``template``/
``block``, method calls and other functions raise ``Unsupported`` naming the construct, so a check says "not verified"
instead of guessing. ``tests/test_gotemplate.py`` renders the same templates with Go's own package and compares.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

NO_VALUE = "<no value>"
_TOKEN = re.compile(r"""\s+|(?P<str>"(?:[^"\\\n]|\\.)*")|(?P<raw>`[^`]*`)|(?P<char>'(?:[^'\\\n]|\\.)+')
    |(?P<decl>:=)|(?P<op>[|(),=])|(?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)|(?P<field>(?:\.[A-Za-z_][A-Za-z0-9_]*)+|\.)
    |(?P<num>[-+]?(?:0[xX][0-9a-fA-F_]+|[0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+))
    |(?P<ident>[A-Za-z_][A-Za-z0-9_]*)""", re.X)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "a": "\a", "b": "\b", "f": "\f",
            "v": "\v"}


class TemplateError(ValueError):
    """The template does not parse or does not execute (Ollama would answer with an error)."""


class Unsupported(TemplateError):
    """A construct this renderer does not implement: the template cannot be checked here (not a difference)."""


@dataclass
class Message:
    """One of Ollama's ``.Messages``: Go struct fields (a missing field is an error, as in Go)."""

    Role: str
    Content: str
    Thinking: str = ""
    Images: list = field(default_factory=list)
    ToolCalls: list = field(default_factory=list)
    ToolName: str = ""


def render(template: str, values: dict) -> str:
    """``template`` executed over ``values`` (a map, e.g. ``{"System": …, "Messages": [Message…]}``)."""
    nodes = _Parser(_lex(template)).parse()
    out: list[str] = []
    _Exec(values, out).run(nodes, values, [{"$": values}])
    return "".join(out)


# -- lexing ------------------------------------------------------------------------------------------------------
def _lex(text: str) -> list:
    """``[("text", str) | ("action", [tokens])]`` with trim markers applied."""
    items, pos = [], 0
    while True:
        start = text.find("{{", pos)
        if start < 0:
            items.append(["text", text[pos:]])
            break
        items.append(["text", text[pos:start]])
        inner = start + 2
        if text.startswith("- ", inner) or text.startswith("-\t", inner) or text.startswith("-\n", inner):
            items[-1][1] = items[-1][1].rstrip(" \t\r\n")
            inner += 2
        end, right_trim = _action_end(text, inner)
        body = text[inner:end]
        pos = end + (4 if right_trim else 2)
        if right_trim:
            nxt = len(text[pos:]) - len(text[pos:].lstrip(" \t\r\n"))
            pos += nxt
        if body.strip().startswith("/*"):
            if not body.strip().endswith("*/"):
                raise TemplateError("unclosed comment")
            continue
        items.append(["action", _tokens(body)])
    return items


def _action_end(text: str, i: int) -> tuple[int, bool]:
    """Where the action starting at ``i`` ends (index of ``}}`` or of `` -}}``'s dash), skipping quoted text."""
    quote = None
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\" and quote != "`":
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in "\"`'":
            quote = c
        elif text.startswith(" -}}", i) or text.startswith("\t-}}", i) or text.startswith("\n-}}", i):
            return i, True
        elif text.startswith("}}", i):
            return i, False
        i += 1
    raise TemplateError("unclosed action")


def _tokens(body: str) -> list[tuple[str, str]]:
    out, pos, spaced = [], 0, True
    body = body.strip()
    while pos < len(body):
        m = _TOKEN.match(body, pos)
        if not m:
            raise TemplateError(f"unexpected {body[pos:pos + 10]!r} in action")
        pos = m.end()
        if not m.lastgroup:
            spaced = True
            continue
        kind = m.lastgroup
        if kind == "field" and not spaced and out and out[-1] == ("op", ")") and m.group() != ".":
            kind = "chainfield"  # (pipeline).Field
        out.append((kind, m.group()))
        spaced = False
    return out


def _unquote(kind: str, text: str):
    if kind == "raw":
        return text[1:-1]
    body, out, i = text[1:-1], [], 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        e = body[i + 1]
        if e in _ESCAPES:
            out.append(_ESCAPES[e])
            i += 2
        elif e in "xuU":
            n = {"x": 2, "u": 4, "U": 8}[e]
            out.append(chr(int(body[i + 2:i + 2 + n], 16)))
            i += 2 + n
        elif e in "01234567":
            out.append(chr(int(body[i + 1:i + 4], 8)))
            i += 4
        else:
            raise TemplateError(f"unknown escape \\{e}")
    s = "".join(out)
    return ord(s) if kind == "char" else s


# -- parsing -----------------------------------------------------------------------------------------------------
@dataclass
class _Pipe:
    decl: list[str]
    assign: bool
    cmds: list[list]  # each command: a list of operands (each a tuple)


class _Parser:
    def __init__(self, items: list):
        self.items, self.i = items, 0

    def parse(self) -> list:
        nodes, stop = self._list(())
        if stop is not None:
            raise TemplateError(f"unexpected {{{{{stop[0]}}}}}")
        return nodes

    def _list(self, stops: tuple) -> tuple[list, tuple | None]:
        nodes = []
        while self.i < len(self.items):
            kind, value = self.items[self.i]
            self.i += 1
            if kind == "text":
                if value:
                    nodes.append(("text", value))
                continue
            word = value[0][1] if value and value[0][0] == "ident" else None
            if word in stops:
                return nodes, (word, value[1:])
            if word in ("end", "else"):
                raise TemplateError(f"unexpected {{{{{word}}}}}")
            nodes.append(self._action(word, value))
        if stops:
            raise TemplateError(f"unexpected end of template: missing {{{{end}}}}")
        return nodes, None

    def _action(self, word, toks):
        if word in ("if", "with", "range"):
            pipe = self._pipe(toks[1:], control=True)
            body, (stop, rest) = self._list(("end", "else"))
            other = []
            if stop == "else":
                if rest and rest[0] == ("ident", "if") and word == "if":
                    return ("if", pipe, body, [self._action("if", rest)])  # {{else if}}: shares this {{end}}
                if rest and rest[0][0] == "ident" and rest[0][1] in ("with",) and word == "with":
                    return ("with", pipe, body, [self._action("with", rest)])
                other, (stop, _r) = self._list(("end",))
            return (word, pipe, body, other)
        if word in ("break", "continue"):
            return (word,)
        if word in ("define", "template", "block"):
            raise Unsupported(f"{{{{{word}}}}}")
        return ("action", self._pipe(toks))

    def _pipe(self, toks: list, control: bool = False) -> _Pipe:
        decl, assign = [], False
        for n in (1, 2):  # $x := … / $i, $m := … / $x = …
            shape = toks[:2 * n]
            names = [t[1] for t in shape[0::2]]
            if len(shape) == 2 * n and all(t[0] == "var" for t in shape[0::2]) and \
                    all(t == ("op", ",") for t in shape[1:-1:2]) and shape[-1][0] in ("decl", "op") and \
                    shape[-1][1] in (":=", "="):
                decl, assign, toks = names, shape[-1][1] == "=", toks[2 * n:]
                break
        cmds, cur, depth, group = [], [], 0, []
        for t in toks:
            if depth:
                if t == ("op", "("):
                    depth += 1
                elif t == ("op", ")"):
                    depth -= 1
                    if depth == 0:
                        cur.append(("pipe", self._pipe(group)))
                        group = []
                        continue
                group.append(t)
            elif t == ("op", "("):
                depth = 1
            elif t == ("op", "|"):
                cmds.append(cur)
                cur = []
            elif t[0] == "chainfield" and cur and cur[-1][0] == "pipe":
                cur[-1] = ("chain", cur[-1], t[1])  # (pipeline).Field
            else:
                cur.append(t)
        if depth:
            raise TemplateError("unclosed left paren")
        cmds.append(cur)
        if any(not c for c in cmds):
            raise TemplateError("missing value for command")
        return _Pipe(decl, assign, cmds)


# -- executing ---------------------------------------------------------------------------------------------------
class _Break(Exception):
    pass


class _Continue(Exception):
    pass


class _Exec:
    def __init__(self, root, out: list):
        self.root, self.out = root, out

    def run(self, nodes: list, dot, scopes: list) -> None:
        for node in nodes:
            kind = node[0]
            if kind == "text":
                self.out.append(node[1])
            elif kind == "action":
                value = self.pipe(node[1], dot, scopes)
                if not node[1].decl:
                    self.out.append(_show(value))
            elif kind in ("if", "with"):
                value = self.pipe(node[1], dot, scopes)
                inner = scopes + [{}]
                if truth(value):
                    self.run(node[2], value if kind == "with" else dot, inner)
                else:
                    self.run(node[3], dot, scopes + [{}])
            elif kind == "range":
                self._range(node, dot, scopes)
            elif kind == "break":
                raise _Break()
            elif kind == "continue":
                raise _Continue()

    def _range(self, node, dot, scopes) -> None:
        pipe = node[1]
        value = self.pipe(_Pipe([], False, pipe.cmds), dot, scopes)
        items = (list(enumerate(value)) if isinstance(value, (list, tuple)) else sorted(value.items())
                 if isinstance(value, dict) else None)
        if items is None:
            if value is None:
                items = []
            else:
                raise TemplateError(f"range can't iterate over {_show(value)}")
        if not items:
            self.run(node[3], dot, scopes + [{}])
            return
        for key, item in items:
            scope = {}
            if len(pipe.decl) == 1:
                scope[pipe.decl[0]] = item
            elif len(pipe.decl) == 2:
                scope[pipe.decl[0]], scope[pipe.decl[1]] = key, item
            try:
                self.run(node[2], item, scopes + [scope])
            except _Continue:
                continue
            except _Break:
                break

    def pipe(self, pipe: _Pipe, dot, scopes: list):
        value, piped = None, False
        for cmd in pipe.cmds:
            value = self.command(cmd, dot, scopes, value if piped else _MISSING)
            piped = True
        if pipe.decl:
            if pipe.assign:
                name = pipe.decl[0]
                for scope in reversed(scopes):
                    if name in scope:
                        scope[name] = value
                        break
                else:
                    raise TemplateError(f"undefined variable: {name}")
            else:
                scopes[-1][pipe.decl[-1]] = value
        return value

    def command(self, cmd: list, dot, scopes, piped):
        head = cmd[0]
        if head[0] == "ident" and head[1] not in ("nil", "true", "false"):
            args = [self.operand(t, dot, scopes) for t in cmd[1:]] + ([] if piped is _MISSING else [piped])
            return call(head[1], args, lambda t=None: None)
        if len(cmd) > 1 or piped is not _MISSING:
            raise Unsupported("arguments to a non-function (a method call)")
        return self.operand(head, dot, scopes)

    def operand(self, tok, dot, scopes):
        kind, text = tok[0], tok[1]
        if kind == "pipe":
            return self.pipe(text, dot, scopes)
        if kind == "chain":
            return _fields(self.operand(tok[1], dot, scopes), tok[2])
        if kind == "field":
            return dot if text == "." else _fields(dot, text)
        if kind == "var":
            name, _, rest = text.partition(".")
            for scope in reversed(scopes):
                if name in scope:
                    return _fields(scope[name], "." + rest) if rest else scope[name]
            raise TemplateError(f"undefined variable: {name}")
        if kind in ("str", "raw", "char"):
            return _unquote(kind, text)
        if kind == "num":
            clean = text.replace("_", "")
            return int(clean, 0) if re.fullmatch(r"[-+]?(0[xX][0-9a-fA-F]+|\d+)", clean) else float(clean)
        if kind == "ident":
            return {"nil": None, "true": True, "false": False}[text] if text in ("nil", "true", "false") else \
                call(text, [], None)
        raise TemplateError(f"unexpected {text!r}")


_MISSING = object()


def _fields(value, chain: str):
    for name in chain.strip(".").split("."):
        if isinstance(value, dict):
            value = value.get(name)
        elif value is None:
            raise TemplateError(f"nil pointer evaluating .{name}")
        elif hasattr(value, "__dataclass_fields__") and name in value.__dataclass_fields__:
            value = getattr(value, name)
        else:
            raise TemplateError(f"can't evaluate field {name} in type {type(value).__name__}")
    return value


def truth(value) -> bool:
    """Go's truth: false, 0, nil, and empty strings, slices and maps are false."""
    if value is None or value is False:
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value != 0
    if isinstance(value, (str, list, tuple, dict)):
        return len(value) > 0
    return True


def _show(value) -> str:
    """How Go's template prints a value (``fmt.Print``)."""
    if value is None:
        return NO_VALUE
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value).replace("e+", "e+0") if "e" in repr(value) else ("%g" % value if value != int(value) else
                                                                             str(int(value)))
    if isinstance(value, (list, tuple)):
        return "[" + " ".join(_show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{_show(v)}" for k, v in sorted(value.items())) + "]"
    if isinstance(value, Message):
        return "{" + " ".join(_show(getattr(value, f)) for f in value.__dataclass_fields__) + "}"
    return str(value)


def _length(value) -> int:
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, (list, tuple, dict)):
        return len(value)
    raise TemplateError(f"len of type {type(value).__name__}")


def _compare(name: str, a, b) -> bool:
    if isinstance(a, bool) != isinstance(b, bool) or (isinstance(a, str) != isinstance(b, str)) or \
            (a is not None and b is not None and isinstance(a, (int, float)) != isinstance(b, (int, float))):
        raise TemplateError(f"error calling {name}: incompatible types for comparison")
    return {"eq": a == b, "ne": a != b, "lt": a < b if name == "lt" else False, "le": a <= b if name == "le" else
            False, "gt": a > b if name == "gt" else False, "ge": a >= b if name == "ge" else False}[name]


def _slice(value, *idx):
    data = value.encode("utf-8") if isinstance(value, str) else value
    if not isinstance(data, (bytes, list, tuple)):
        raise TemplateError(f"can't slice item of type {type(value).__name__}")
    lo = idx[0] if idx else 0
    hi = idx[1] if len(idx) > 1 else len(data)
    if not 0 <= lo <= hi <= len(data):
        raise TemplateError(f"error calling slice: index out of range: {hi}")
    part = data[lo:hi]
    return part.decode("utf-8", errors="replace") if isinstance(value, str) else list(part)


def _index(value, *keys):
    for k in keys:
        if isinstance(value, dict):
            value = value.get(k)
        elif isinstance(value, (list, tuple, str)):
            data = value.encode("utf-8") if isinstance(value, str) else value
            if not isinstance(k, int) or not 0 <= k < len(data):
                raise TemplateError(f"error calling index: index out of range: {k}")
            value = data[k]
        else:
            raise TemplateError(f"can't index item of type {type(value).__name__}")
    return value


def _sprint(*args) -> str:
    out = ""
    for i, a in enumerate(args):
        if i and not isinstance(a, str) and not isinstance(args[i - 1], str):
            out += " "
        out += _show(a)
    return out


def _printf(fmt: str, *args) -> str:
    it = iter(args)

    def one(m):
        verb = m.group(1)
        if verb == "%":
            return "%"
        v = next(it, _MISSING)
        if v is _MISSING:
            return f"%!{verb}(MISSING)"
        if verb == "q":
            return json.dumps(v, ensure_ascii=False) if isinstance(v, str) else _show(v)
        if verb == "d" and isinstance(v, int):
            return str(v)
        if verb in ("s", "v", "d"):
            return _show(v)
        raise Unsupported(f"printf verb %{verb}")
    return re.sub(r"%([a-zA-Z%])", one, fmt)


def _json(value) -> str:
    def plain(v):
        if isinstance(v, Message):
            return {"role": v.Role, "content": v.Content}
        return [plain(x) for x in v] if isinstance(v, (list, tuple)) else v
    text = json.dumps(plain(value), ensure_ascii=False, separators=(",", ":"))
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def call(name: str, args: list, _unused=None):
    """The built-in (and Ollama's) template functions; ``Unsupported`` for any other."""
    if name == "and":
        return next((a for a in args if not truth(a)), args[-1] if args else None)
    if name == "or":
        return next((a for a in args if truth(a)), args[-1] if args else None)
    if name == "not":
        return not truth(args[0])
    if name in ("eq", "ne", "lt", "le", "gt", "ge"):
        if len(args) < 2:
            raise TemplateError(f"wrong number of args for {name}")
        if name == "eq":
            return any(_compare("eq", args[0], b) for b in args[1:])
        return _compare(name, args[0], args[1])
    simple = {"len": _length, "slice": _slice, "index": _index, "print": _sprint, "printf": _printf,
              "println": lambda *a: " ".join(_show(x) for x in a) + "\n", "json": _json}
    if name in simple:
        return simple[name](*args)
    raise Unsupported(f"the function '{name}'")
