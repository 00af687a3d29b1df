"""The cheap streaming check of a dataset file (light: standard library; no torch, no ``datasets``).

Every line of a JSONL file is parsed once, one at a time (constant memory), its record format detected
from the first records and every record checked against it, so a broken line or a record that does
not match is reported with its file, line and field before anything heavy starts. The result is
cached by the file's path, size and modification time (and the settings that change the verdict),
so a second run and every resume skip the pass.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trainer.core.errors import UserError
from trainer.data import formats, pictures
from trainer.data.demo import cache_dir
from trainer.data.readers import (
    Records,
    check_fields,
    file_format_of,
    read_records,
    resolve_path,
    template_fields,
)

SAMPLE_ROWS = 100    # records kept for format detection and previews
ROLE_PATTERNS = 200  # distinct role sequences of conversations kept (each with its first line) for the template check
WHOLE_FILE_BYTES = 8 * 2**20  # JSONL below this is read whole by records.read_records (its messages are the richest)
_SCAN_VERSION = 4    # bump when the checks change, so older cached verdicts are not trusted


@dataclass
class Scan:
    """What the check found: the file, its record format, the true record count, skipped line numbers."""

    path: str
    kind: str                      # file type: jsonl, json, txt, csv, parquet
    record_format: str
    records: int
    skipped_lines: list[int] = field(default_factory=list)
    sample: list[dict] = field(default_factory=list)
    roles: list = field(default_factory=list)  # conversations: [[role, ...], 'line N'] per distinct role sequence
    # vision-language data: records_with_pictures, pictures, max_per_record (pictures.PictureCount)
    pictures: dict = field(default_factory=lambda: pictures.PictureCount().as_dict())
    picture_stamp: str | None = None   # every picture's path, size and mtime hashed (None: no pictures)
    skipped_records: list[int] = field(default_factory=list)  # non-JSONL: 0-based records skipped (skip_bad_lines)


class _PictureCheck:
    """Every picture of every record checked (it exists and is a picture), counted and fingerprinted; a bad one is
    bad input naming the file, the line and the picture, or — with ``data.skip_bad_lines`` — its record is skipped."""

    def __init__(self, p: Path, data_cfg, role: str):
        self.p, self.role, self.skip = p, role, data_cfg.skip_bad_lines
        self.count, self.stamp = pictures.PictureCount(), pictures.Stamp()

    def __call__(self, rec: dict, fmt: str, where: str) -> bool:
        """True when the record is kept (its pictures are fine, or it has none)."""
        try:
            paths = pictures.check(rec, fmt, self.p.parent)
        except pictures.PictureProblem as exc:
            if self.skip:
                return False
            raise UserError(f"{self.role}: {self.p} {where}, field '{exc.field}': {exc.problem}; fix the path or the "
                            f"picture, drop the record, or set data.skip_bad_lines: true to skip such records (they "
                            f"are counted)", field=self.role, path=str(self.p)) from None
        self.count.add(len(paths))
        for path in paths:
            self.stamp.add(path)
        return True

    def fields(self) -> dict:
        """The Scan fields this check fills."""
        return {"pictures": self.count.as_dict(), "picture_stamp": self.stamp.value()}


class _Roles:
    """The distinct role sequences of a file's conversations, each with where it first occurs, so the
    worker can try every one through the chat template before training (a role the template refuses
    is then reported with its line before the first step, not in the middle of a run)."""

    def __init__(self):
        self.seen: dict[tuple, str] = {}

    def add(self, rec: dict, fmt: str, where: str) -> None:
        if fmt in formats.CONVERSATION_FORMATS and len(self.seen) < ROLE_PATTERNS:
            try:
                key = tuple(m.get("role") for m in formats.to_messages(rec, fmt))
            except (KeyError, TypeError, ValueError, AttributeError):
                return
            self.seen.setdefault(key, where)

    def found(self) -> list:
        return [[list(k), where] for k, where in self.seen.items()]


def scan(path: str, data_cfg, role: str = "data.path") -> Scan:
    """Check every record of ``path`` against the configured or detected record format (cached).
    Raises UserError naming the file, the line (JSONL) or record, the field and the fix."""
    p = resolve_path(path)
    _check_file(p, role)
    kind = file_format_of(p, data_cfg.format)
    stat = p.stat()
    key = _key(p, stat, kind, data_cfg)
    cached = _load_cached(key)
    if cached is not None:
        return cached
    result = _scan_jsonl(p, data_cfg, role) if kind == "jsonl" else _scan_whole(p, kind, data_cfg, role)
    _store(key, result)
    return result


def cached(path: str, data_cfg) -> Scan | None:
    """The cached scan of ``path`` with these settings, or None; never reads the records (the planner asks: it
    stays instant)."""
    try:
        p = resolve_path(path)
        return _load_cached(_key(p, p.stat(), file_format_of(p, data_cfg.format), data_cfg))
    except (OSError, ValueError, UserError):
        return None


def _check_file(p: Path, role: str) -> None:
    if not p.exists():
        raise UserError(f"{role}: dataset file not found: {p}; check the path (or use 'demo')", field=role, path=str(p))
    if p.is_dir():
        raise UserError(f"{role}: {p} is a folder; point {role} at one data file", field=role, path=str(p))


def _scan_jsonl(p: Path, data_cfg, role: str) -> Scan:
    if p.stat().st_size < WHOLE_FILE_BYTES:
        return _scan_whole(p, "jsonl", data_cfg, role)
    fmt, sample, pending, skipped, count, seen_text, roles = None, [], [], [], 0, False, _Roles()
    pics, dropped = _PictureCheck(p, data_cfg, role), set()

    def check(n: int, o: dict) -> bool:
        nonlocal seen_text
        seen_text |= _check(o, fmt, data_cfg, p, f"line {n}", role)
        if not pics(o, fmt, f"line {n}"):
            skipped.append(n)
            dropped.add(id(o))
            return False
        roles.add(o, fmt, f"line {n}")
        return True

    with open(p, "rb") as fh:
        for no, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                obj = _json_line(raw, no)
                if not isinstance(obj, dict):
                    raise ValueError("found a JSON value that is not an object where {...} belongs")
            except (ValueError, UnicodeDecodeError) as exc:
                if data_cfg.skip_bad_lines:
                    skipped.append(no)
                    continue
                why = f"{exc.msg} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else str(exc)
                raise UserError(f"{role}: {p} line {no} is not a JSON object ({why}); fix that line, or set "
                                f"data.skip_bad_lines: true to skip bad lines (they are counted)", field=role,
                                path=str(p)) from None
            count += 1
            if len(sample) < SAMPLE_ROWS:
                sample.append(obj)
            if fmt is None:
                pending.append((no, obj))
                if len(pending) < 20:
                    continue
                fmt = formats.record_format_of([o for _, o in pending], data_cfg)
                count -= sum(not check(n, o) for n, o in pending)
                pending = []
            elif not check(no, obj):
                count -= 1
    if fmt is None and pending:
        fmt = formats.record_format_of([o for _, o in pending], data_cfg)
        count -= sum(not check(n, o) for n, o in pending)
    if not count:
        raise UserError(f"{role}: dataset file {p} is empty; add records or pick another file", field=role, path=str(p))
    _check_some_text(fmt, seen_text, data_cfg, p)
    return Scan(str(p), "jsonl", fmt, count, sorted(skipped), [o for o in sample if id(o) not in dropped],
                roles.found(), **pics.fields())


_RAW_DECODE = json.JSONDecoder().raw_decode


def _json_line(raw: bytes, no: int):
    """One JSONL line parsed as ``json.loads`` would (same errors and columns), at half its cost: the line is
    decoded once as UTF-8 (a byte-order mark allowed on line 1) and handed to the decoder's scanner, skipping
    ``json.loads``' per-call encoding detection (1M 480-byte lines: 3.0 s of CPU instead of 4.9 s, alternating runs)."""
    text = raw.decode("utf-8-sig" if no == 1 else "utf-8")
    start = len(text) - len(text.lstrip())
    obj, end = _RAW_DECODE(text, start)
    rest = text[end:].lstrip()
    if rest.strip():
        raise json.JSONDecodeError("Extra data", text, len(text) - len(rest))
    return obj


def _scan_whole(p: Path, kind: str, data_cfg, role: str) -> Scan:
    recs = read_records(str(p), data_cfg.format, data_cfg.skip_bad_lines)
    fmt = formats.record_format_of(recs.rows, data_cfg)
    if fmt in ("text", "template"):
        check_fields(recs, data_cfg)
    lines, numbers = _line_numbers(p, kind, recs)
    seen_text, roles, pics, dropped = False, _Roles(), _PictureCheck(p, data_cfg, role), []
    for i, row in enumerate(recs.rows):
        seen_text |= _check(row, fmt, data_cfg, p, lines(i), role)
        if not pics(row, fmt, lines(i)):
            dropped.append(i)
            continue
        roles.add(row, fmt, lines(i))
    if len(dropped) == len(recs.rows):
        raise UserError(f"{role}: no record of {p} has readable pictures (the first bad one is {lines(dropped[0])}); "
                        f"check the picture paths (relative to the data file's folder)", field=role, path=str(p))
    _check_some_text(fmt, seen_text, data_cfg, p)
    gone = set(dropped)
    kept = [row for i, row in enumerate(recs.rows) if i not in gone]
    skipped = sorted(recs.skipped_lines + [numbers[i] for i in dropped]) if numbers is not None else recs.skipped_lines
    return Scan(str(p), kind, fmt, len(kept), skipped, kept[:SAMPLE_ROWS], roles.found(), **pics.fields(),
                skipped_records=dropped if numbers is None else [])


def _line_numbers(p: Path, kind: str, recs: Records):
    """``(where(i) -> 'line N' or 'record N', line numbers of the records or None when the file has no lines)``."""
    if kind != "jsonl":
        return (lambda i: f"record {i + 1}"), None
    skipped = set(recs.skipped_lines)
    numbers = [no for no, line in enumerate(p.read_text(encoding="utf-8-sig").splitlines(), 1)
               if line.strip() and no not in skipped]
    return (lambda i: f"line {numbers[i]}" if i < len(numbers) else f"record {i + 1}"), numbers


def _check(rec: dict, fmt: str, data_cfg, p: Path, where: str, role: str) -> bool:
    """UserError when ``rec`` does not match ``fmt``; returns True when it holds trainable text."""
    if fmt == "template":
        for name in template_fields(data_cfg.prompt_template or "") + template_fields(data_cfg.response_template or ""):
            if rec.get(name) is None:
                raise UserError(f"data.prompt_template/response_template: {p} {where}: field '{name}' is absent "
                                f"(fields present: {', '.join(sorted(rec)) or 'none'}); use only those fields in the "
                                f"templates or fix the record", field="data.prompt_template", path=str(p))
        return True
    problem = formats.check_record(rec, fmt, data_cfg.text_field)
    if problem:
        name, why = problem
        fix = "fix or drop the record" if fmt != "text" else "set data.text_field to the field that holds the text"
        raise UserError(f"{role}: {p} {where}, field '{name}': {why} (records were detected as {fmt}: "
                        f"{formats.describe(fmt)}); {fix}, or set data.record_format", field=role, path=str(p))
    if fmt in formats.PAIR_FORMATS and pictures.pair_has_pictures(rec):
        raise UserError(f"{role}: {p} {where}: a {fmt} record with pictures; preference training (DPO, KTO, ORPO) reads "
                        f"text only and would drop them: train on these pictures with supervised chat records "
                        f"(messages with image parts), or remove the pictures", field=role, path=str(p))
    if fmt == "text":
        v = rec.get(data_cfg.text_field)
        return isinstance(v, str) and bool(v.strip()) or (v is not None and not isinstance(v, str))
    return True


def _check_some_text(fmt: str, seen_text: bool, data_cfg, p: Path) -> None:
    if fmt == "text" and not seen_text:
        raise UserError(f"data.text_field: '{data_cfg.text_field}' is empty in every record of {p}; "
                        f"put the text there or set data.text_field to the field that holds it",
                        field="data.text_field", path=str(p))


def record_line(path: str, index: int) -> str:
    """'line N' of the ``index``-th (0-based) record of a JSONL file, else 'record N' (for error messages)."""
    p = resolve_path(path)
    if p.suffix.lower() not in (".jsonl", ".ndjson"):
        return f"record {index + 1}"
    seen = -1
    try:
        with open(p, "rb") as fh:
            for no, raw in enumerate(fh, 1):
                if raw.strip():
                    seen += 1
                    if seen == index:
                        return f"line {no}"
    except OSError:
        pass
    return f"record {index + 1}"


# -- the verdict cache -------------------------------------------------------------------------------
def _key(p: Path, stat: os.stat_result, kind: str, d) -> str:
    parts = [_SCAN_VERSION, str(p.resolve()), stat.st_size, stat.st_mtime_ns, kind, d.record_format, d.text_field,
             d.prompt_template, d.response_template, d.skip_bad_lines]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:24]


def _load_cached(key: str) -> Scan | None:
    f = cache_dir() / "scans" / f"{key}.json"
    try:
        return Scan(**json.loads(f.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


def _store(key: str, result: Scan) -> None:
    folder = cache_dir() / "scans"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"{key}.tmp{os.getpid()}"
        tmp.write_text(json.dumps(asdict(result), default=str), encoding="utf-8")
        os.replace(tmp, folder / f"{key}.json")
    except OSError:
        pass  # a cache that cannot be written only costs the next run this pass again
