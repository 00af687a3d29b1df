"""The event stream and status file: the contract between trainer, supervisor and GUI.

``events.jsonl`` holds one JSON object per line, appended and flushed per line. Readers tolerate a
half-written last line and unknown fields or types. ``status.json`` is replaced atomically.
Light module (standard library only): the GUI imports it.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.rundir.records import RECORDS, STEP_FIELDS, EventRecord  # noqa: F401  (STEP_FIELDS re-exported)
from trainer.rundir.stopfile import STOP_FILE  # noqa: F401  (re-exported: readers know it from here)

EVENTS_FILE = "events.jsonl"
TELEMETRY_FILE = "telemetry.jsonl"
STATUS_FILE = "status.json"


class EventWriter:
    """Appends events to a JSONL file, one flushed line each (safe to share between processes)."""

    def __init__(self, path: str | Path, redact=None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._redact = redact

    def emit(self, record: EventRecord) -> dict:
        """Append a typed record (``trainer.rundir.records``; ``time``, Unix seconds, is added). Returns the
        event as written. The only way events are written: every writer shares one definition per type."""
        event = {"type": record.TYPE, "time": time.time(), **record.fields()}
        line = json.dumps(event, default=_jsonable)
        if self._redact:
            line = self._redact(line)
        # O_APPEND + one write() per line: concurrent writers (worker and supervisor) never interleave.
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (line + "\n").encode("utf-8"))
        finally:
            os.close(fd)
        return event

    def write(self, type: str, **fields: Any) -> dict:
        """``emit`` the record of ``type`` made from ``fields`` (unknown fields ride in ``extra``); a type
        without a record raises ValueError. For tests and fixtures: product code builds the record itself."""
        cls = RECORDS.get(type)
        if cls is None:
            raise ValueError(f"no event record for type '{type}' (trainer/rundir/records.py)")
        return self.emit(cls.from_event(fields))


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    return str(obj)


def parse_lines(text: str) -> list[dict]:
    """Events in ``text``; skips blank, malformed and non-object lines (a half-written tail)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("type"), str):
            out.append(obj)
    return out


def read_events(path: str | Path) -> list[dict]:
    """All complete events in a JSONL file ([] when it does not exist)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    return parse_lines(data.decode("utf-8", errors="replace"))


@dataclass
class JsonlTail:
    """Incremental reader: each ``poll()`` returns only the new complete lines since the last one.

    A line without its newline yet is left for the next poll, so a writer caught mid-line is never
    misread. Truncation or replacement of the file restarts from the beginning.
    """

    path: Path
    offset: int = 0
    _inode: Any = field(default=None, repr=False)

    def poll(self, max_bytes: int = 16 << 20) -> list[dict]:
        """New events (dicts with a string ``type``, or any object for telemetry files)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return []
        if st.st_ino != self._inode or st.st_size < self.offset:
            self._inode, self.offset = st.st_ino, 0
        if st.st_size == self.offset:
            return []
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            chunk = fh.read(max_bytes)
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        return json_objects(chunk[: end + 1].splitlines())


def json_objects(lines) -> list[dict]:
    """The JSON objects among ``lines`` (bytes or text), in order; lines that are not one (a half-written
    last line, a stray print) are skipped. The one rule for every JSON-lines reader (events, child stdout)."""
    out = []
    for raw in lines:
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Replace ``path`` with JSON ``data`` atomically (temp file in the same folder, fsync, rename)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, default=_jsonable)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_json(path: str | Path) -> dict | None:
    """A JSON object from ``path``, or None when missing or unreadable."""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def write_status(run_dir: str | Path, **fields: Any) -> dict:
    """Merge ``fields`` into ``status.json`` and replace it atomically. Returns the new status."""
    path = Path(run_dir) / STATUS_FILE
    status = read_json(path) or {
        "state": "starting", "pid": None, "step": 0, "max_steps": None,
        "last_checkpoint": None, "attempt": 1,
    }
    status.update(fields)
    status["updated"] = time.time()
    write_json_atomic(path, status)
    return status


def read_status(run_dir: str | Path) -> dict | None:
    """The run's ``status.json`` or None."""
    return read_json(Path(run_dir) / STATUS_FILE)
