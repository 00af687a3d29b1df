"""Bad config input in words: ``ConfigError`` (every problem at once, each naming its field and the fix)
and the translation of pydantic's errors into those messages (unknown keys with a suggestion, a key in
the wrong section, union fields reported once). Light module.
"""
from __future__ import annotations

import difflib

from pydantic import BaseModel

from trainer.config.sections import RunConfig


class ConfigError(Exception):
    """Bad user input. ``problems`` lists ``(field path, message with the fix)`` pairs."""
    def __init__(self, problems: list[tuple[str, str]], source: str | None = None):
        self.problems = problems
        self.source = source
        super().__init__(self.render())

    def render(self) -> str:
        head = f"{self.source}: " if self.source else ""
        if len(self.problems) == 1:
            loc, msg = self.problems[0]
            return f"{head}{loc}: {msg}" if loc else f"{head}{msg}"
        lines = [f"{head}{len(self.problems)} problems in the config:"]
        lines += [f"  - {loc}: {msg}" if loc else f"  - {msg}" for loc, msg in self.problems]
        return "\n".join(lines)


_SECTIONS = {name: f.annotation for name, f in RunConfig.model_fields.items()
             if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)}


def known_keys(path: tuple[str, ...] = ()) -> list[str]:
    """Field names valid at a dotted location (``()`` is the top level)."""
    model: type[BaseModel] = RunConfig
    for part in path:
        model = _SECTIONS.get(part) if model is RunConfig else None  # type: ignore[assignment]
        if model is None:
            return []
    return list(model.model_fields)


def _suggest(key: str, path: tuple[str, ...]) -> str:
    options = known_keys(path)
    close = difflib.get_close_matches(key, options, n=1, cutoff=0.6)
    if close:
        return f"unknown key '{key}'; did you mean '{close[0]}'?"
    # A key put in the wrong section is a common slip: look in the others.
    for sec, model in _SECTIONS.items():
        if key in model.model_fields:
            return f"unknown key '{key}' here; it belongs in '{sec}' ({sec}.{key})"
    return f"unknown key '{key}'; valid keys: {', '.join(options)}"


def fix_for(err: dict) -> str:
    kind, msg = err["type"], err["msg"]
    inp = err.get("input")
    if kind == "extra_forbidden":
        loc = tuple(str(x) for x in err["loc"])
        return _suggest(loc[-1], loc[:-1])
    if kind in ("greater_than", "greater_than_equal"):
        return f"{msg.lower()} (got {inp!r}); use a positive value"
    if kind in ("int_parsing", "int_type", "float_parsing", "float_type", "bool_parsing", "bool_type"):
        want = {"int": "a whole number", "flo": "a number", "boo": "true or false"}[kind[:3]]
        return f"expected {want}, got {inp!r}"
    if kind in ("literal_error", "union_tag_invalid"):
        return f"got {inp!r}; {msg[0].lower() + msg[1:]}"
    if kind == "model_type":
        return f"expected a mapping of keys (a YAML section), got {inp!r}"
    if kind == "value_error":
        return msg.removeprefix("Value error, ")
    return msg


_BRANCH_WORDS = {"int": "a positive whole number", "bool": "true or false", "list[str]": "a list of names"}


def _is_branch(part: object) -> bool:
    return isinstance(part, str) and (part in _BRANCH_WORDS or part.startswith("literal["))


def dedupe_union(errors: list[dict]) -> list[dict]:
    """Union fields (``int | 'auto'``) report one error per branch: merge them into one per field."""
    by_loc: dict[tuple, list[dict]] = {}
    for e in errors:
        loc = tuple(str(x) for x in e["loc"] if not _is_branch(x))
        by_loc.setdefault(loc, []).append(e)
    out = []
    for loc, errs in by_loc.items():
        if len(errs) == 1:
            out.append(dict(errs[0], loc=loc))
            continue
        own = [e for e in errs if e["type"] == "value_error"]  # our validator's message is the precise one
        if own:
            out.append(dict(own[0], loc=loc))
            continue
        wanted = []
        for e in errs:
            branch = next((x for x in e["loc"] if _is_branch(x)), "")
            wanted.append(_BRANCH_WORDS.get(branch) or branch.removeprefix("literal[").removesuffix("]"))
        out.append(dict(errs[0], loc=loc, type="custom",
                        msg=f"expected {' or '.join(wanted)}, got {errs[0].get('input')!r}"))
    return out
