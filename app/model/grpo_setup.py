"""The wizard's GRPO words and checks (no Qt): is the chosen file a prompt dataset with reference answers, which
built-in rewards there are (the schema's own descriptions), whether the Reward page may go on, and the reward
preview's JSON as table rows.

``look_at_data`` runs off the GUI thread (it reads the file): the light scan first; a file the scan refuses (a
prompt dataset has no text field) or one whose first records are prompts with references is read as GRPO prompts
by ``trainer.data.prompts`` (every record checked, its true count)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trainer.config.sections import RewardsConfig
from trainer.core.errors import UserError
from trainer.data.prompts import PROMPT_SHAPES, detect_prompt_shape, read_prompt_records
from trainer.data.readers import read_records
from trainer.data.rewards import BUILTIN_NAMES
from trainer.data.scan import scan

SHAPE_WORDS = {
    "prompt": "prompts with reference answers",
    "gsm8k": "GSM8K-style questions with worked answers; the reference is what follows '####'",
}
assert set(SHAPE_WORDS) == set(PROMPT_SHAPES)
# The built-in rewards as the page lists them: label, and the rewards.* parameters shown beside each.
BUILTIN_LABELS = {"exact_answer": "Exact answer", "numeric_answer": "Numeric answer", "format": "Format",
                  "json_valid": "Valid JSON", "length_penalty": "Length penalty"}
BUILTIN_PARAMS = {"numeric_answer": ("numeric_tolerance",), "format": ("format_pattern",),
                  "length_penalty": ("length_target",)}
assert set(BUILTIN_LABELS) == set(BUILTIN_NAMES)
NO_REWARD = "Tick at least one reward (with a weight above 0) or choose a Python file of reward functions."


@dataclass
class PromptData:
    """A prompt dataset: its shape ('prompt' or 'gsm8k'), the true record count, the first raw records."""

    path: str
    shape: str
    records: int
    sample: list[dict] = field(default_factory=list)

    @property
    def record_format(self) -> str:
        """The shape, as the Data page's 'format' (one of PROMPT_SHAPES)."""
        return self.shape


def look_at_data(path: str, data_cfg, answer_field: str = "answer"):
    """A ``Scan`` for supervised or preference records, a ``PromptData`` for prompts with references; raises the
    scan's UserError for a file that is neither (reads the file: call off the GUI thread)."""
    try:
        found = scan(path, data_cfg)
    except UserError as refused:
        try:
            head = read_records(path, data_cfg.format, data_cfg.skip_bad_lines, limit=20).rows
        except UserError:
            raise refused from None
        if detect_prompt_shape(head, answer_field) is None:
            raise
        return _prompts(path, head, data_cfg, answer_field)
    head = found.sample[:20]
    if detect_prompt_shape(head, answer_field) is None:
        return found
    return _prompts(path, head, data_cfg, answer_field)


def _prompts(path: str, head: list[dict], data_cfg, answer_field: str) -> PromptData:
    rows = read_prompt_records(path, answer_field, data_cfg.format, data_cfg.skip_bad_lines)
    return PromptData(path, detect_prompt_shape(head, answer_field), len(rows), head)


def describe_shape(shape: str) -> str:
    """What the records are, for the Data page (how GRPO uses them: ``GRPO_USE``)."""
    return SHAPE_WORDS[shape]


GRPO_USE = ("Two ways to learn from them: SFT trains on each answer with its prompt masked (a prompt and its answer); "
            "GRPO samples several answers per prompt and the rewards (next page) score them.")


# One short line each for the page (the schema's full description is the tooltip: ``builtin_help``).
BUILTIN_SHORT = {"exact_answer": "1 if the answer equals the reference", "numeric_answer": "1 if the number is "
                 "within the tolerance", "format": "1 if the whole completion matches", "json_valid": "1 if it parses "
                 "as JSON", "length_penalty": "0 to -1 past the target length"}
assert set(BUILTIN_SHORT) == set(BUILTIN_NAMES)


def builtin_what(name: str) -> str:
    """What a built-in reward scores, in a few words (its tooltip has the schema's description)."""
    return BUILTIN_SHORT[name]


def builtin_help(name: str) -> str:
    """The schema's description of ``rewards.<name>`` (never restated here)."""
    return RewardsConfig.model_fields[name].description or ""


def has_reward(values: dict) -> bool:
    """True when a built-in reward has a weight above 0 or a Python file is named (dotted config values)."""
    weighted = any(isinstance(values.get(f"rewards.{n}"), (int, float)) and values[f"rewards.{n}"] > 0
                   for n in BUILTIN_NAMES)
    return weighted or bool((values.get("rewards.python") or "").strip())


def python_file_problem(text: str | None, cwd: Path | None = None) -> str | None:
    """Why the reward file path typed cannot be used (None when it can, or when none is typed)."""
    text = (text or "").strip()
    if not text:
        return None
    p = Path(text).expanduser()
    where = p if p.is_absolute() else (cwd or Path.cwd()) / p
    if where.is_dir():
        return f"rewards.python: {text} is a folder; choose a .py file of reward functions"
    if not where.is_file():
        rel = "" if p.is_absolute() else f" (relative to {cwd or Path.cwd()})"
        return f"rewards.python: file not found: {text}{rel}"
    if where.suffix != ".py":
        return f"rewards.python: {text} is not a .py file; reward functions are Python code"
    return None


def parse_tolerance(text: str) -> float:
    """``rewards.numeric_tolerance`` from what was typed ('1e-6', '0.01'); ValueError with the reason."""
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError("not a number") from None
    if not value >= 0:
        raise ValueError("must be 0 or more")
    return value


def preview_table(doc: dict) -> tuple[list[str], list[list[str]]]:
    """``(headers, rows)`` of a reward preview document: one row per completion, with its prompt (first row of a
    group only), the reference, the completion, each function's score and the weighted total."""
    names = [f["name"] for f in doc.get("functions", [])]
    headers = ["Prompt", "Reference", "Completion", *names, "Total"]
    rows = []
    for p in doc.get("prompts", []):
        for i, c in enumerate(p.get("completions", [])):
            scores = [_score(c.get("rewards", {}).get(n)) for n in names]
            rows.append([p.get("prompt", "") if i == 0 else "", str(p.get("reference", "")) if i == 0 else "",
                         c.get("text", ""), *scores, _score(c.get("total"))])
    return headers, rows


def preview_summary(doc: dict) -> str:
    """'3 prompts × 4 completions; mean total 0.42; groups with no learning signal: 2 of 3'."""
    prompts = doc.get("prompts", [])
    totals = [c.get("total") for p in prompts for c in p.get("completions", []) if isinstance(c.get("total"), (int, float))]
    flat = sum(1 for p in prompts if len({c.get("total") for c in p.get("completions", [])}) <= 1)
    k = max((len(p.get("completions", [])) for p in prompts), default=0)
    mean = f"{sum(totals) / len(totals):.3g}" if totals else "–"
    return (f"{len(prompts)} prompts × {k} completions; mean total reward {mean}; groups whose completions all scored "
            f"the same (no learning signal): {flat} of {len(prompts)}")


def _score(v) -> str:
    return "–" if not isinstance(v, (int, float)) or isinstance(v, bool) else f"{v:.3g}"
