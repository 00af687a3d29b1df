"""Reading dataset files into records, with errors that name the file, the line and the fix.

Light module (standard library; pyarrow only for parquet): the supervisor's preflight and the GUI's
data preview use it without importing torch. The worker feeds the same records to ``datasets``.
"""
from __future__ import annotations

import csv
import io
import json
import string
from dataclasses import dataclass, field
from pathlib import Path

from trainer.core.errors import UserError
from trainer.core.paths import DEMO_DATA

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".txt": "txt", ".text": "txt",
           ".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
_JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "true/false", type(None): "null"}


@dataclass
class Records:
    """Records read from one file, and how many lines were skipped (with their numbers)."""

    path: Path
    rows: list[dict]
    skipped_lines: list[int] = field(default_factory=list)


def bundled_demo_path() -> Path:
    """The bundled sample dataset (JSONL, field 'text')."""
    return DEMO_DATA


def resolve_path(path: str) -> Path:
    """'demo' → the bundled sample; anything else as given (``~`` expanded)."""
    return bundled_demo_path() if path == "demo" else Path(path).expanduser()


def file_format_of(path: Path, fmt: str = "auto") -> str:
    """The file format: ``fmt`` unless 'auto', else from the extension (UserError when unknown)."""
    if fmt != "auto":
        return fmt
    kind = FORMATS.get(path.suffix.lower())
    if not kind:
        raise UserError(f"data.path: cannot tell the format of {path} from its extension; "
                        f"use .jsonl/.json/.txt/.csv/.parquet or set data.format", field="data.format", path=str(path))
    return kind


def read_records(path: str, fmt: str = "auto", skip_bad_lines: bool = False, limit: int | None = None,
                 drop_lines=(), drop_records=()) -> Records:
    """Read a dataset file into a list of dict records. Raises UserError naming the file (and line). ``drop_lines``
    (JSONL line numbers) and ``drop_records`` (0-based indices, other files) leave out records the scan skipped
    (``data.skip_bad_lines``: a record whose picture is missing)."""
    p = resolve_path(path)
    if not p.exists():
        raise UserError(f"data.path: dataset file not found: {p}; check the path (or use 'demo')", field="data.path", path=str(p))
    if p.is_dir():
        raise UserError(f"data.path: {p} is a folder; point data.path at one data file", field="data.path", path=str(p))
    kind = file_format_of(p, fmt)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise UserError(f"data.path: cannot read {p}: {exc.strerror}; check its permissions", field="data.path", path=str(p)) from None
    if not raw.strip():
        raise UserError(f"data.path: dataset file {p} is empty; add records or pick another file", field="data.path", path=str(p))
    if kind == "parquet":
        gone = set(drop_records)
        return Records(p, [r for i, r in enumerate(_read_parquet(p, raw, limit)) if i not in gone])
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise UserError(f"data.path: {p} is not UTF-8 text (bad byte at line {line}); re-save it as UTF-8",
                        field="data.path", path=str(p)) from None
    if kind == "jsonl":
        records = _read_jsonl(p, text, skip_bad_lines, limit, set(drop_lines))
    else:
        records = {"json": _read_json, "txt": _read_txt, "csv": _read_csv}[kind](p, text, skip_bad_lines, limit)
    if drop_records:
        gone = set(drop_records)
        records.rows = [r for i, r in enumerate(records.rows) if i not in gone]
    if not records.rows:
        raise UserError(f"data.path: {p} holds no records; add data or pick another file", field="data.path", path=str(p))
    return records


def _read_jsonl(p: Path, text: str, skip: bool, limit: int | None, drop: set = frozenset()) -> Records:
    rows, skipped = [], []
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip() or no in drop:
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError(f"found a JSON {_JSON_KINDS.get(type(obj), 'value')} where {{...}} belongs")
        except ValueError as exc:
            if skip:
                skipped.append(no)
                continue
            why = f"{exc.msg} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise UserError(f"data.path: {p} line {no} is not a JSON object ({why}); fix that line, "
                            f"or set data.skip_bad_lines: true to skip bad lines (they are counted)",
                            field="data.path", path=str(p)) from None
        rows.append(obj)
        if limit and len(rows) >= limit:
            break
    return Records(p, rows, skipped)


def _read_json(p: Path, text: str, skip: bool, limit: int | None) -> Records:
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise UserError(f"data.path: {p} is not valid JSON (line {getattr(exc, 'lineno', '?')}); fix it, or save one "
                        f"object per line as .jsonl", field="data.path", path=str(p)) from None
    if isinstance(obj, dict):  # {"data": [...]} or {"train": [...]}
        lists = [v for v in obj.values() if isinstance(v, list)]
        obj = lists[0] if len(lists) == 1 else None
    if not isinstance(obj, list) or not all(isinstance(r, dict) for r in obj):
        raise UserError(f"data.path: {p} must hold a list of objects (records); reshape it or use .jsonl",
                        field="data.path", path=str(p))
    return Records(p, obj[:limit] if limit else obj)


def _read_txt(p: Path, text: str, skip: bool, limit: int | None) -> Records:
    rows = [{"text": line} for line in text.splitlines() if line.strip()]
    return Records(p, rows[:limit] if limit else rows)


def _read_csv(p: Path, text: str, skip: bool, limit: int | None) -> Records:
    try:
        reader = csv.DictReader(io.StringIO(text))
        rows = []
        for row in reader:
            rows.append(row)
            if limit and len(rows) >= limit:
                break
    except csv.Error as exc:
        raise UserError(f"data.path: {p} is not valid CSV (line {reader.line_num}: {exc}); fix it",
                        field="data.path", path=str(p)) from None
    return Records(p, rows)


def _read_parquet(p: Path, raw: bytes, limit: int | None) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError("data.path: reading .parquet needs pyarrow (pip install pyarrow)", field="data.path") from None
    try:
        table = pq.read_table(io.BytesIO(raw))
    except Exception as exc:  # pyarrow raises several types for corrupt files
        raise UserError(f"data.path: {p} is not a readable parquet file ({type(exc).__name__}); re-export it",
                        field="data.path", path=str(p)) from None
    if limit:
        table = table.slice(0, limit)
    return table.to_pylist()


def template_fields(template: str) -> list[str]:
    """Record fields named in a ``{field}`` template."""
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


def text_field_fix(fields: list[str]) -> str:
    """The fix for records without the text field: the field that holds the whole text, or — since records with
    two or more fields are usually a prompt and its answer, and training on one field would drop the other — the
    prompt/response templates that train the answer with the prompt masked."""
    if len(fields) < 2:
        return "set data.text_field to the field that holds the text"
    prompt, answer = fields[0], fields[-1]
    return (f"set data.text_field to the field that holds the whole text, or, when a field is a prompt and another "
            f"its answer, set data.prompt_template: '{{{prompt}}}' and data.response_template: '{{{answer}}}' (your "
            "field names; the answer is trained, the prompt masked)")


def check_fields(records: Records, data_cfg) -> None:
    """UserError when the text field or a template field is absent from the records."""
    rows = records.rows
    if data_cfg.prompt_template is not None:
        needed = template_fields(data_cfg.prompt_template) + template_fields(data_cfg.response_template or "")
        where = "data.prompt_template/response_template"
    else:
        needed, where = [data_cfg.text_field], "data.text_field"
    present = set().union(*(r.keys() for r in rows[:100]))
    for name in needed:
        missing = next((i for i, r in enumerate(rows) if name not in r or r[name] is None), None)
        if missing is not None:
            fields = ", ".join(sorted(present)) or "none"
            fix = text_field_fix(list(rows[missing])) if where == "data.text_field" else f"use only those fields in {where}"
            raise UserError(f"{where}: field '{name}' is absent from record {missing + 1} of {records.path} "
                            f"(fields present: {fields}); {fix}", field=where, path=str(records.path))
    if data_cfg.prompt_template is None and not any(str(r[data_cfg.text_field]).strip() for r in rows):
        raise UserError(f"data.text_field: '{data_cfg.text_field}' is empty in every record of {records.path}; "
                        f"put the text there or set data.text_field to the field that holds it",
                        field="data.text_field", path=str(records.path))
