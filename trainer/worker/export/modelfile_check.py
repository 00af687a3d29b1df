"""An exported Ollama ``Modelfile`` against training: its ``TEMPLATE``, rendered with Go's ``text/template`` semantics
(``gotemplate``) as Ollama's server calls it, equals training's render of the run's own prompts; its ``PARAMETER stop``
lines hold every end-of-turn token; its ``SYSTEM`` is the system prompt every training record shared (and none when
they did not); ``FROM`` names the export's GGUF; ``num_ctx`` holds the sequence length training used."""
from __future__ import annotations

import re
from pathlib import Path

from trainer.worker.export import gotemplate

_COMMAND = re.compile(r"^\s*([A-Za-z]+)\s+(.*)$", re.S)


def parse(text: str) -> dict:
    """``{"from", "froms", "template", "system", "parameters": {name: [values]}}`` of a Modelfile (Ollama's syntax:
    ``\"\"\"…\"\"\"`` blocks, ``"…"`` strings, bare values, ``#`` comments). ``from`` is the first ``FROM`` (the
    model), ``froms`` all of them (a vision-language export's second names its projector)."""
    out = {"from": None, "froms": [], "template": None, "system": None, "parameters": {}}
    i, lines = 0, text.split("\n")
    while i < len(lines):
        line = lines[i]
        i += 1
        m = _COMMAND.match(line)
        if not m or line.lstrip().startswith("#"):
            continue
        cmd, rest = m.group(1).upper(), m.group(2)
        if cmd == "PARAMETER":
            name, _, value = rest.strip().partition(" ")
            out["parameters"].setdefault(name.lower(), []).append(_value(value.strip()))
            continue
        if rest.startswith('"""'):
            body = rest[3:]
            while '"""' not in body and i < len(lines):
                body += "\n" + lines[i]
                i += 1
            rest = '"""' + body
        value = _value(rest.strip())
        if cmd == "FROM":
            out["froms"].append(value)
            out["from"] = out["froms"][0]
        elif cmd in ("TEMPLATE", "SYSTEM"):
            out[cmd.lower()] = value
    return out


def _value(text: str) -> str:
    if text.startswith('"""'):
        return text[3:text.index('"""', 3)] if '"""' in text[3:] else text[3:]
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1]
    return text


def ollama_messages(raw: list[dict], system: str | None) -> list:
    """What Ollama's chat hands its template for a request of ``raw`` messages: the Modelfile's SYSTEM first when the
    request has no system message (``server/routes.go``), as ``Message`` values."""
    msgs = list(raw)
    if system and not (msgs and msgs[0].get("role") == "system"):
        msgs = [{"role": "system", "content": system}] + msgs
    return [gotemplate.Message(str(m.get("role")), _text(m.get("content"))) for m in msgs]


def _text(content) -> str:
    """A message's content as Ollama's API carries it: a string (content parts' texts joined; pictures travel
    beside it, in ``images``)."""
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content or "")


def render(template: str, messages: list) -> str:
    """``template`` as Ollama executes it for a chat (``template.Execute``: ``.System`` joins the system messages)."""
    system = "\n\n".join(m.Content for m in messages if m.Role == "system")
    return gotemplate.render(template, {"System": system, "Messages": messages, "Tools": None, "Response": "",
                                        "Think": False, "ThinkLevel": "", "IsThinkSet": False})


def check(folder: Path, record: dict, cases, want_text, stop_tokens: list[str], seq_len: int) -> dict:
    """The Modelfile of ``folder`` against training (module doc). ``want_text(case)``: training's prompt text as Ollama
    sends it (no BOS where the GGUF adds one); ``stop_tokens``: every end-of-turn token."""
    path = folder / "Modelfile"
    mf = parse(path.read_text(encoding="utf-8"))
    diffs, equal, unsupported = [], 0, None
    if mf["from"] != f"./{record.get('gguf')}":
        diffs.append(f"FROM is {mf['from']!r}, not this export's GGUF './{record.get('gguf')}'")
    if record.get("mmproj") and f"./{record['mmproj']}" not in mf["froms"][1:]:
        diffs.append(f"no second FROM names the projector './{record['mmproj']}': Ollama would read no pictures")
    stops = mf["parameters"].get("stop", [])
    missing = [s for s in stop_tokens if s not in stops]
    if missing:
        diffs.append(f"PARAMETER stop lacks {', '.join(map(repr, missing))}: Ollama would not stop there")
    if (mf["system"] or None) != (record.get("system") or None):
        diffs.append(f"SYSTEM is {mf['system']!r} but training's records shared {record.get('system')!r}")
    ctx = mf["parameters"].get("num_ctx", [None])[-1]
    if ctx is None or not str(ctx).isdigit() or int(ctx) < seq_len:
        diffs.append(f"PARAMETER num_ctx is {ctx!r}, below the {seq_len} tokens training used (data.seq_len)")
    if mf["template"] is None:
        diffs.append("no TEMPLATE: Ollama would guess one, or send the bare prompt")
    for case in cases if mf["template"] is not None else []:
        try:
            got = render(mf["template"], ollama_messages(case.raw, mf["system"]))
        except gotemplate.Unsupported as exc:
            unsupported = f"the TEMPLATE uses {exc}, which TrainPilot's text/template renderer does not implement"
            break
        except gotemplate.TemplateError as exc:
            diffs.append(f"{case.where}: the TEMPLATE does not execute in Go's text/template ({exc})")
            continue
        want = want_text(case)
        if got == want:
            equal += 1
            continue
        k = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        diffs.append(f"{case.where}: the TEMPLATE renders {got[max(0, k - 20):k + 30]!r} where training has "
                     f"{want[max(0, k - 20):k + 30]!r} (character {k})")
    result = {"ok": not diffs, "equal": equal, "of": len(cases), "stops": stops, "system": mf["system"],
              "num_ctx": ctx, "differences": diffs}
    if unsupported and not diffs:
        result.update(ok=None, not_verified=unsupported)
    return result
