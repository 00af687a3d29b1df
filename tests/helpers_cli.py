"""Helpers for tests that drive the real ``trainpilot-cli`` (``python -m trainer``) in child processes.

Each test gets a workspace folder (pytest's ``tmp_path``) that holds the user's files: config,
dataset, model folders, earlier runs. ``tree_digest`` fingerprints that folder so a test can show
that a refused command changed nothing the user already had, and created no run directory.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DEMO_DATA = REPO / "trainer" / "resources" / "demo.jsonl"
TINY_ARCH = REPO / "trainer" / "resources" / "models" / "tiny-llama.json"
CLI = [sys.executable, "-m", "trainer"]
# Bad input is answered in preflight, before torch is imported: a generous bound per command (seconds).
PREFLIGHT_TIMEOUT = 60
# A real 2-4 step CPU run of the tiny model takes ~10-20 s on a busy 2-core machine (seconds).
TRAIN_TIMEOUT = 300


def base_config(ws: Path) -> dict:
    """A valid config for a 2-step CPU run of the tiny demo model on ``ws/train.jsonl``.

    Every value the planner could choose is explicit, so the run is the same on any machine.
    """
    return {
        "schema_version": 1, "name": "badinput", "device": "cpu",
        "model": {"source": "demo-tiny-llama"},
        "data": {"path": str(ws / "train.jsonl"), "seq_len": 32},
        "training": {"max_steps": 2, "effective_batch_size": 2, "micro_batch_size": 1,
                     "gradient_accumulation_steps": 2, "learning_rate": 1e-3, "seed": 7},
        "speed": {"precision": "fp32", "gradient_checkpointing": False},
        "deepspeed": {"enabled": False},
        "checkpoints": {"every_steps": 1, "keep_last": 2},
        "output": {"runs_dir": str(ws / "runs"), "tensorboard": False},
    }


def set_dotted(data: dict, key: str, value) -> None:
    """``data[a][b] = value`` for ``key == "a.b"`` (creating sections); ``value is DELETE`` removes it."""
    *head, last = key.split(".")
    node = data
    for k in head:
        node = node.setdefault(k, {})
    if value is DELETE:
        node.pop(last, None)
    else:
        node[last] = value


DELETE = object()


def write_config(ws: Path, changes: dict | None = None, name: str = "config.yaml") -> Path:
    """Write ``base_config`` with dotted ``changes`` applied to ``ws/name``; returns the path."""
    data = base_config(ws)
    for key, value in (changes or {}).items():
        set_dotted(data, key, value)
    path = ws / name
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def write_demo_data(path: Path, lines: int = 200) -> Path:
    """The first ``lines`` records of the bundled sample dataset, as JSONL at ``path``."""
    with open(DEMO_DATA, encoding="utf-8") as src:
        head = [next(src) for _ in range(lines)]
    path.write_text("".join(head), encoding="utf-8")
    return path


def run_cli(args: list[str], cwd: Path, env: dict | None = None, timeout: float = PREFLIGHT_TIMEOUT,
            python_code: str | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m trainer ARGS`` (or ``python -c CODE ARGS``) in ``cwd``; text output captured."""
    cmd = [sys.executable, "-c", python_code, *args] if python_code else [*CLI, *args]
    full_env = dict(os.environ, PYTHONUNBUFFERED="1")
    full_env.update(env or {})
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


def tree_digest(root: Path) -> dict[str, str]:
    """Relative path → SHA-256 of content (files), 'dir' (folders), 'link:<target>' (symlinks)."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = f"link:{os.readlink(p)}"
            elif p.is_dir():
                out[rel] = f"dir:{oct(p.stat().st_mode & 0o777)}"
            else:
                st = p.stat()
                try:
                    content = hashlib.sha256(p.read_bytes()).hexdigest()
                except PermissionError:  # a file the test made unreadable: size and time stand in
                    content = f"unreadable:{st.st_size}:{st.st_mtime_ns}"
                out[rel] = f"{content}:{oct(st.st_mode & 0o777)}"
    return out


def permissions_enforced() -> bool:
    """Whether file modes stop this process (not for root with CAP_DAC_OVERRIDE, nor on Windows): probed."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        probe = Path(d) / "probe"
        probe.write_text("x")
        probe.chmod(0o000)
        try:
            probe.read_text()
            return False
        except PermissionError:
            return True
        finally:
            probe.chmod(0o600)


def assert_refused(proc: subprocess.CompletedProcess, code: int, needles: tuple[str, ...]) -> None:
    """The command exited with ``code``, printed a short message containing every needle
    (case-insensitive), and no traceback."""
    both = proc.stdout + proc.stderr
    detail = f"exit {proc.returncode}\n--- stdout:\n{proc.stdout}\n--- stderr:\n{proc.stderr}"
    assert "Traceback" not in both, detail
    assert proc.returncode == code, detail
    assert proc.stderr.strip(), "the message must go to stderr\n" + detail
    low = proc.stderr.lower()
    missing = [n for n in needles if n.lower() not in low]
    assert not missing, f"message lacks {missing}\n{detail}"
    assert len(proc.stderr.strip().splitlines()) <= 12, "one readable message, not a dump\n" + detail


def files_containing(root: Path, needles: list[bytes]) -> list[str]:
    """Files under ``root`` (any type, read as bytes) that contain any of ``needles``."""
    hits = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            data = p.read_bytes()
            hits += [f"{p}: {n[:6]!r}…" for n in needles if n in data]
    return hits
