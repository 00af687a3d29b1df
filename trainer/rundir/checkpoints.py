"""Checkpoint folders: which are complete, which is newest, where partial ones are staged.

A checkpoint is written into ``checkpoints/.staging-<step>/``, fsynced, given a marker file, and
renamed to ``checkpoints/checkpoint-<step>/``; a folder without the marker is never trusted.
Light module (standard library only).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

MARKER = "trainpilot_checkpoint.json"
_NAME = re.compile(r"^checkpoint-(\d+)$")


def staging_dir(root: Path, step: int) -> Path:
    """Where the checkpoint of ``step`` is written before it is renamed into place."""
    return Path(root) / f".staging-{step}"


def complete_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoint folders under ``root``, oldest step first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        m = _NAME.match(child.name)
        if m and child.is_dir() and (child / MARKER).is_file() and _marker_ok(child / MARKER):
            found.append((int(m.group(1)), child))
    return [p for _, p in sorted(found)]


def _marker_ok(path: Path) -> bool:
    try:
        return isinstance(json.loads(path.read_text(encoding="utf-8")), dict)
    except (OSError, ValueError):
        return False


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    done = complete_checkpoints(root)
    return done[-1] if done else None


def checkpoint_step(path: str | Path) -> int:
    """The optimizer step of a checkpoint folder (from its name)."""
    m = _NAME.match(Path(path).name)
    return int(m.group(1)) if m else -1


def fsync_tree(folder: Path) -> None:
    """Flush every file under ``folder`` to disk (so a power loss cannot leave renamed-but-empty files)."""
    for dirpath, _, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def clean_staging(root: str | Path) -> list[Path]:
    """Remove leftover ``.staging-*`` folders from a killed worker. Returns what was removed."""
    import shutil

    root = Path(root)
    removed = []
    if root.is_dir():
        for child in root.glob(".staging-*"):
            shutil.rmtree(child, ignore_errors=True)
            removed.append(child)
    return removed
