"""GRPO rewards: the built-in ones (configured in YAML, weighted), the user's own from a Python file, and the checks
that make a bad reward fail before a run starts. Light (the standard library and the config schema; no torch): the
worker, the reward preview and the pre-run check (``trainer.worker.probes.grpocheck``) call these; the user's file is
imported only there. The built-in rewards' names are read off the schema (``RewardsConfig.builtin_names``).

Every reward has TRL's signature ``f(prompts, completions, completion_ids=None, **columns) -> list[float | None]``:
one number per completion (None: "does not apply", TRL skips it in the mean). Completions arrive as text, or in
TRL's conversational form ``[{"role": "assistant", "content": ...}]`` when the prompts are messages; dataset
columns (the reference answer under ``rewards.answer_field``, any other record field) arrive as keyword lists.

Built-in rewards (``rewards.<name>`` is the weight; 0 turns it off):
- ``exact_answer``: 1 when the extracted final answer equals the reference (whitespace and case ignored), else 0;
- ``numeric_answer``: 1 when the extracted answer is a number within ``numeric_tolerance`` (relative) of the
  reference, else 0;
- ``format``: 1 when the whole completion matches ``format_pattern`` (e.g. ``<think>…</think><answer>…</answer>``);
- ``json_valid``: 1 when the completion (or the answer inside its tags, or a ```json fence) parses as JSON;
- ``length_penalty``: 0 up to ``length_target`` tokens, falling linearly to -1 at ``grpo.max_completion_length``.
"""
from __future__ import annotations

import functools
import importlib.util
import inspect
import json
import math
import numbers
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from trainer.config.sections import RewardsConfig
from trainer.data import conversations
from trainer.data.prompts import GSM8K_MARK
from trainer.core.errors import UserError

BUILTIN_NAMES = RewardsConfig.builtin_names()  # read off the schema: rewards.<name> is each one's weight
ANSWER_TAGS = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
NUMBER = re.compile(r"[-+]?\$?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+")
JSON_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S | re.I)


@dataclass(frozen=True)
class Reward:
    """One reward function of a run: its name (the charts' label), the checked function, its weight."""

    name: str
    func: Callable
    weight: float
    builtin: bool


# -- reading completions ---------------------------------------------------------------------------
def completion_text(completion) -> str:
    """The text of a completion: a string, or the assistant contents of TRL's conversational form."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(m.get("content") or "" for m in completion if isinstance(m, dict))
    if isinstance(completion, dict):
        return completion.get("content") or ""
    return str(completion)


def extract_answer(text: str, pattern: Optional[str] = None) -> Optional[str]:
    """The final answer in ``text``: ``pattern``'s first group (or whole match) when set; else the last
    ``<answer>…</answer>``; else what follows ``####``; else None."""
    if pattern:
        m = re.search(pattern, text, re.S)
        if not m:
            return None
        return (m.group(1) if m.groups() else m.group(0)).strip()
    tags = ANSWER_TAGS.findall(text)
    if tags:
        return tags[-1].strip()
    m = GSM8K_MARK.search(text)
    return m.group(1).strip() if m else None


def final_answer(completion, pattern: Optional[str] = None) -> Optional[str]:
    """What the answer rewards compare: ``extract_answer`` of the completion's text after a thinking model's
    reasoning block (``<think>…</think>``, Qwen3, DeepSeek-R1: the chat rules' ``answer_text``); without a ``pattern``,
    the whole answer when nothing is marked (exact match compares it whole, the numeric reward takes its last number)."""
    text = conversations.answer_text(completion_text(completion))
    got = extract_answer(text, pattern)
    return text if got is None and not pattern else got


def _normal(text: str) -> str:
    return " ".join(str(text).split()).casefold()


def parse_number(text: Optional[str]) -> Optional[float]:
    """The (last) number in ``text``: '1,234', '$5', '-3.5', '2e3'; None when there is none."""
    if text is None:
        return None
    found = NUMBER.findall(str(text))
    if not found:
        return None
    try:
        return float(found[-1].replace(",", "").replace("$", ""))
    except ValueError:
        return None


# -- the built-in rewards ----------------------------------------------------------------------------
def _references(kwargs: dict, field: str, n: int) -> list:
    refs = kwargs.get(field)
    if refs is None:
        raise UserError(f"rewards.answer_field: the records have no field '{field}' (the reference answer); set "
                        f"rewards.answer_field to the field that holds it", field="rewards.answer_field")
    return list(refs) + [None] * (n - len(refs))


def make_exact_answer(answer_field: str, pattern: Optional[str]):
    def exact_answer(prompts, completions, completion_ids=None, **kwargs):
        refs = _references(kwargs, answer_field, len(completions))
        out = []
        for c, ref in zip(completions, refs):
            got = final_answer(c, pattern)
            out.append(1.0 if got is not None and ref is not None and _normal(got) == _normal(ref) else 0.0)
        return out
    return exact_answer


def make_numeric_answer(answer_field: str, pattern: Optional[str], tolerance: float):
    def numeric_answer(prompts, completions, completion_ids=None, **kwargs):
        refs = _references(kwargs, answer_field, len(completions))
        out = []
        for c, ref in zip(completions, refs):
            value = parse_number(final_answer(c, pattern))
            want = parse_number(ref)
            ok = value is not None and want is not None and \
                abs(value - want) <= tolerance * max(1.0, abs(want))
            out.append(1.0 if ok else 0.0)
        return out
    return numeric_answer


def make_format(pattern: str):
    try:
        compiled = re.compile(pattern, re.S)
    except re.error as exc:
        raise UserError(f"rewards.format_pattern: {pattern!r} is not a valid regular expression ({exc}); fix it",
                        field="rewards.format_pattern") from None

    def format(prompts, completions, completion_ids=None, **kwargs):  # noqa: A001 - the reward's name
        return [1.0 if compiled.search(completion_text(c)) else 0.0 for c in completions]
    return format


def make_json_valid(pattern: Optional[str]):
    def json_valid(prompts, completions, completion_ids=None, **kwargs):
        out = []
        for c in completions:
            text = completion_text(c)
            fence = JSON_FENCE.search(text)
            inner = extract_answer(text, pattern)
            candidate = fence.group(1) if fence else inner if inner is not None else text
            try:
                json.loads(candidate.strip())
                out.append(1.0)
            except ValueError:
                out.append(0.0)
        return out
    return json_valid


def make_length_penalty(target: int, max_length: int):
    span = max(1, max_length - target)

    def length_penalty(prompts, completions, completion_ids=None, **kwargs):
        lengths = [len(ids) for ids in completion_ids] if completion_ids is not None else \
            [len(completion_text(c).split()) for c in completions]
        return [-min(1.0, max(0, n - target) / span) for n in lengths]
    return length_penalty


def builtin_rewards(rewards_cfg, max_completion_length: int) -> list[Reward]:
    """The built-in rewards with a weight above 0, in BUILTIN_NAMES order."""
    r = rewards_cfg
    pattern = r.answer_pattern or None
    if pattern:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise UserError(f"rewards.answer_pattern: {pattern!r} is not a valid regular expression ({exc}); fix it",
                            field="rewards.answer_pattern") from None
    makers = {"exact_answer": lambda: make_exact_answer(r.answer_field, pattern),
              "numeric_answer": lambda: make_numeric_answer(r.answer_field, pattern, r.numeric_tolerance),
              "format": lambda: make_format(r.format_pattern),
              "json_valid": lambda: make_json_valid(pattern),
              "length_penalty": lambda: make_length_penalty(r.length_target, max_completion_length)}
    return [Reward(name, makers[name](), float(getattr(r, name)), True)
            for name in BUILTIN_NAMES if getattr(r, name) > 0]


# -- the user's own rewards ---------------------------------------------------------------------------
def load_python_rewards(path: str, weights: dict[str, float] | None = None) -> list[Reward]:
    """The public functions defined in the Python file ``path`` (in the order written), checked: importable, plain
    ``def`` taking ``(prompts, completions, **kwargs)``, not named like a built-in. UserError (field rewards.python)
    naming the file, the function and the problem. Importing runs the file: only the worker and its probes call this."""
    p = Path(path).expanduser()
    where = "rewards.python"
    if not p.is_file():
        raise UserError(f"{where}: {'is a folder' if p.is_dir() else 'file not found'}: {p}; point it at a .py file "
                        f"of reward functions", field=where, path=str(p))
    if p.suffix != ".py":
        raise UserError(f"{where}: {p} is not a .py file; reward functions are Python code", field=where, path=str(p))
    module = _import_file(p)
    found = [(n, f) for n, f in vars(module).items()
             if inspect.isfunction(f) and f.__module__ == module.__name__ and not n.startswith("_")]
    if not found:
        raise UserError(f"{where}: {p} defines no public function; write e.g. def my_reward(prompts, completions, "
                        f"**kwargs): return [1.0 if ... else 0.0 for c in completions]", field=where, path=str(p))
    weights = dict(weights or {})
    unknown = sorted(set(weights) - {n for n, _ in found})
    if unknown:
        raise UserError(f"rewards.python_weights: {unknown[0]} is not a function of {p} (it has "
                        f"{', '.join(n for n, _ in found)}); fix the name", field="rewards.python_weights")
    out = []
    for name, func in found:
        _check_signature(name, func, p)
        out.append(Reward(name, checked(name, func, str(p)), float(weights.get(name, 1.0)), False))
    return out


def _import_file(p: Path):
    name = f"trainpilot_user_rewards_{abs(hash(str(p.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, p)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        raise UserError(f"rewards.python: {p} line {exc.lineno}: syntax error: {exc.msg}; fix the file",
                        field="rewards.python", path=str(p)) from None
    except ImportError as exc:
        sys.modules.pop(name, None)
        missing = getattr(exc, "name", None)
        fix = f"install it (pip install {missing}) or remove the import" if missing else "fix the import"
        raise UserError(f"rewards.python: importing {p} failed at line {_user_line(exc, p)}: {exc}; {fix}",
                        field="rewards.python", path=str(p)) from None
    except Exception as exc:  # the file's own top-level code failed
        sys.modules.pop(name, None)
        raise UserError(f"rewards.python: importing {p} failed at line {_user_line(exc, p)}: "
                        f"{type(exc).__name__}: {exc}; fix the file", field="rewards.python", path=str(p)) from None
    return module


def _user_line(exc: BaseException, p: Path) -> str:
    """The deepest line of ``p`` in the exception's traceback ('?' when none)."""
    line, tb = "?", exc.__traceback__
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename).resolve() == p.resolve():
            line = str(tb.tb_lineno)
        tb = tb.tb_next
    return line


def _check_signature(name: str, func, p: Path) -> None:
    def bad(problem: str):
        raise UserError(f"rewards.python: {name} in {p} {problem}", field="rewards.python", path=str(p))

    if name in BUILTIN_NAMES:
        bad(f"has the name of a built-in reward; rename it (e.g. my_{name})")
    if inspect.iscoroutinefunction(func) or inspect.isgeneratorfunction(func):
        bad("must be a plain def returning a list of numbers (not async, not a generator)")
    params = list(inspect.signature(func).parameters.values())
    if not any(q.kind == q.VAR_KEYWORD for q in params):
        bad("must take **kwargs: TRL calls it by keyword with prompts, completions, completion_ids and every record "
            f"field (e.g. the reference answer); write def {name}(prompts, completions, **kwargs)")
    required_positional = [q.name for q in params if q.kind == q.POSITIONAL_ONLY and q.default is q.empty]
    if required_positional:
        bad(f"takes positional-only parameter(s) {', '.join(required_positional)}; TRL passes everything by keyword: "
            f"write def {name}(prompts, completions, **kwargs)")


def checked(name: str, func, source: str = ""):
    """``func`` wrapped so a wrong result fails with one clear message: it must return one number (or None) per
    completion. The wrapper keeps the name (TRL labels the metrics with ``__name__``)."""
    where = f" in {source}" if source else ""

    @functools.wraps(func)
    def wrapper(prompts, completions, **kwargs):
        try:
            result = func(prompts=prompts, completions=completions, **kwargs)  # by keyword, as TRL calls it
        except UserError:
            raise
        except Exception as exc:
            raise UserError(f"rewards.python: {name}{where} raised {type(exc).__name__}: {exc} (line "
                            f"{_user_line(exc, Path(source)) if source else '?'}); fix the function",
                            field="rewards.python") from None
        return _numbers(name, where, result, len(completions))

    wrapper.__name__ = name
    return wrapper


def _numbers(name: str, where: str, result, n: int) -> list[Optional[float]]:
    if hasattr(result, "tolist"):  # a numpy array or a tensor
        result = result.tolist()
    if not isinstance(result, (list, tuple)):
        raise UserError(f"rewards.python: {name}{where} returned {type(result).__name__}, not a list; return one "
                        f"number per completion", field="rewards.python")
    if len(result) != n:
        raise UserError(f"rewards.python: {name}{where} returned {len(result)} value(s) for {n} completions; return "
                        f"one number (or None) per completion", field="rewards.python")
    out = []
    for i, v in enumerate(result):
        if v is None:
            out.append(None)
        elif isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v)):
            out.append(float(v))
        else:
            raise UserError(f"rewards.python: {name}{where} returned {v!r} for completion {i + 1}; return a finite "
                            f"number (or None) per completion", field="rewards.python")
    return out


# -- the run's rewards -----------------------------------------------------------------------------------
def reward_functions(cfg) -> list[Reward]:
    """Every reward of the run: the weighted built-ins, then the Python file's functions."""
    out = builtin_rewards(cfg.rewards, cfg.grpo.max_completion_length)
    if cfg.rewards.python:
        out += load_python_rewards(cfg.rewards.python, cfg.rewards.python_weights)
    if not out:
        raise UserError("rewards: GRPO needs at least one reward: give a built-in one a weight (e.g. "
                        "rewards.exact_answer: 1.0) or set rewards.python", field="rewards")
    return out


def score(rewards: list[Reward], prompts: list, completions: list, completion_ids=None,
          columns: dict | None = None) -> dict:
    """``{"rewards": {name: [value per completion]}, "total": [weighted sum per completion]}`` (None counts as 0 in the
    total, as TRL's nansum does). The rewards get what TRL passes outside the record fields too: ``trainer_state``
    (None here) and ``log_extra``/``log_metric`` (ignored)."""
    columns = dict(columns or {}, trainer_state=None, log_extra=_ignore, log_metric=_ignore)  # set after, as TRL does
    per = {r.name: r.func(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
           for r in rewards}
    total = [sum(r.weight * (per[r.name][i] or 0.0) for r in rewards) for i in range(len(completions))]
    return {"rewards": per, "total": total}


def dry_run(rewards: list[Reward], records: list[dict], answer_field: str, limit: int = 4) -> None:
    """Call every reward once on completions made from the first records (the reference inside answer tags, and an
    empty answer), the way TRL calls them: a wrong return fails here, before the run starts."""
    rows = records[:limit]
    prompts, completions, ids, columns = [], [], [], {}
    for row in rows:
        conversational = isinstance(row["prompt"], list)
        for text in (f"<think>…</think><answer>{row.get(answer_field, '')}</answer>", ""):
            prompts.append(row["prompt"])
            completions.append([{"role": "assistant", "content": text}] if conversational else text)
            ids.append(list(range(len(text.split()))))
            for k, v in row.items():
                if k != "prompt":
                    columns.setdefault(k, []).append(v)
    n = len(completions)
    columns = {k: v for k, v in columns.items() if len(v) == n}  # fields every record has, as TRL's columns
    score(rewards, prompts, completions, completion_ids=ids, columns=columns)


def _ignore(*args, **kwargs) -> None:
    """Stands in for TRL's log_extra / log_metric callbacks outside training."""
