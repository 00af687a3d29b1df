"""One line of a readiness check (the doctor's and preflight's shape)."""
from __future__ import annotations


def check(name: str, ok: bool, detail: str, fix: str = "", required: bool = True) -> dict:
    """``{name, ok, detail, fix, required}``; ``fix`` is empty when ok."""
    return {"name": name, "ok": bool(ok), "detail": detail, "fix": "" if ok else fix, "required": required}
