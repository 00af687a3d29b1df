"""The suite's config and CLI kit: configs for the bundled tiny model, the real ``trainpilot-cli`` in a child process
(started as a user's), what a run wrote, a user's workspace (what a refused command must leave untouched), and the
trained runs the after-training tests share. README "Writing a test" says when to use what.

(Not conftest.py: tests/app has its own conftest, and `from conftest import` would be ambiguous.)
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from shared_once import shared_once
from trainer.core.dotted import get_in, set_in
from trainer.core.paths import DEMO_DATA, MODELS_DIR

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
TINY_ARCH = MODELS_DIR / "tiny-llama.json"
CLI = [sys.executable, "-m", "trainer"]
# Bad input is answered in preflight, before torch is imported: a generous bound per command (seconds).
PREFLIGHT_TIMEOUT = 60
# A real 2-4 step CPU run of the tiny model takes ~10-20 s on a busy 2-core machine (seconds).
TRAIN_TIMEOUT = 300
DELETE = object()  # a value of ``write_workspace_config``'s changes: remove the key
# Several ranks against one (gloo, fp32, the CPU): the averaged gradients of N ranks and one rank's over the same
# samples differ only in rounding (relative)
RANKS_LOSS_TOLERANCE = 1e-4


# --- configs -----------------------------------------------------------------------------------------------------

def _merge(cfg: dict, sections: dict) -> dict:
    """``sections`` onto ``cfg``: a dict updates its section, anything else replaces the key."""
    for key, value in sections.items():
        if isinstance(value, dict):
            cfg.setdefault(key, {}).update(value)
        else:
            cfg[key] = value
    return cfg


def tiny_config(**sections) -> dict:
    """A config for the bundled tiny model on the bundled data, fp32 CPU, explicit batch geometry.

    ``sections`` merge into the defaults, e.g. ``tiny_config(training={"max_steps": 4})``.
    """
    return _merge({
        "schema_version": 1, "name": "t", "device": "cpu",
        "model": {"source": "demo-tiny-llama"},
        "data": {"path": "demo", "seq_len": 64, "packing": True},
        "training": {"max_steps": 6, "effective_batch_size": 8, "micro_batch_size": 4,
                     "gradient_accumulation_steps": 2, "learning_rate": 3e-3, "lr_scheduler": "linear",
                     "warmup_steps": 0, "seed": 7},
        "speed": {"precision": "fp32", "gradient_checkpointing": False},
        "deepspeed": {"enabled": False},
        "checkpoints": {"every_steps": 2, "keep_last": 10},
        "output": {"tensorboard": False},
    }, sections)


def write_config(path: Path, cfg: dict) -> Path:
    """Write ``cfg`` as YAML to ``path`` and return it."""
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return path


def workspace_config(ws: Path) -> dict:
    """A valid config for a 2-step CPU run of the tiny demo model on the user's ``ws/train.jsonl``, its runs in
    ``ws/runs``. Every value the planner could choose is explicit, so the run is the same on any machine."""
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


def write_workspace_config(ws: Path, changes: dict | None = None, name: str = "config.yaml") -> Path:
    """Write ``workspace_config`` with dotted ``changes`` (``{"training.max_steps": 3}``; a value ``DELETE`` removes
    the key) to ``ws/name``; returns the path."""
    data = workspace_config(ws)
    for key, value in (changes or {}).items():
        if value is DELETE:
            parent, _, last = key.rpartition(".")
            section = get_in(data, parent) if parent else data
            if isinstance(section, dict):
                section.pop(last, None)
        else:
            set_in(data, key, value)
    return write_config(ws / name, data)


def write_demo_data(path: Path, lines: int = 200) -> Path:
    """The first ``lines`` records of the bundled sample dataset, as JSONL at ``path``."""
    with open(DEMO_DATA, encoding="utf-8") as src:
        head = [next(src) for _ in range(lines)]
    path.write_text("".join(head), encoding="utf-8")
    return path


# --- the CLI as a user runs it -----------------------------------------------------------------------------------

def cli(*args, env: dict | None = None, timeout: float = 600, cwd: Path | None = None,
        python_code: str | None = None) -> subprocess.CompletedProcess:
    """Run ``trainpilot-cli ARGS`` (``python -m trainer``; or ``python -c CODE ARGS`` for a CLI started behind a
    few lines that change its world, e.g. hide a package) in ``cwd`` (the repository by default) with ``env`` over
    this process's environment; text output captured."""
    cmd = [sys.executable, "-c", python_code, *map(str, args)] if python_code else [*CLI, *map(str, args)]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout, cwd=cwd or REPO)


def run_cli(args: list[str], cwd: Path, env: dict | None = None, timeout: float = PREFLIGHT_TIMEOUT,
            python_code: str | None = None) -> subprocess.CompletedProcess:
    """``cli`` in a user's workspace, bounded by how fast preflight answers unless ``timeout`` says otherwise."""
    return cli(*args, env=env, timeout=timeout, cwd=cwd, python_code=python_code)


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


def free_port() -> int:
    """A TCP port nobody listens on now (a launcher's rendezvous: two tests' ranks must never meet)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- what a run wrote --------------------------------------------------------------------------------------------

def events(run_dir: Path, kind: str | None = None) -> list[dict]:
    """Events of a run directory (of one type when ``kind`` is given)."""
    from trainer.rundir.events import read_events

    evs = read_events(Path(run_dir) / "events.jsonl")
    return [e for e in evs if kind is None or e.get("type") == kind]


def losses(run_dir: Path) -> dict[int, float]:
    """step → loss from the run's step events (the last value wins for a repeated step)."""
    return {e["step"]: e["loss"] for e in events(run_dir, "step")}


def trained_losses(folder: Path, name: str, env: dict | None = None, **sections) -> dict[int, float]:
    """Train ``tiny_config(**sections)`` with ``trainpilot-cli run`` into ``folder/name`` (asserts it finished) and
    return its step → loss: the reference runs that several ranks' losses are compared with."""
    cfg = write_config(Path(folder) / f"{name}.yaml", tiny_config(**sections))
    run = Path(folder) / name
    proc = cli("run", cfg, "--run-dir", run, "--quiet", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return losses(run)


def final_weights(run_dir: Path) -> dict:
    """Tensors of ``final/model.safetensors``."""
    from safetensors.torch import load_file

    return load_file(str(Path(run_dir) / "final" / "model.safetensors"))


def dump(obj) -> str:
    return json.dumps(obj, indent=1, default=str)


needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                     reason="DeepSpeed is not installed")


# --- a user's workspace: what a refused command must leave as it was ----------------------------------------------

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


def files_containing(root: Path, needles: list[bytes]) -> list[str]:
    """Files under ``root`` (any type, read as bytes) that contain any of ``needles``."""
    hits = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            data = p.read_bytes()
            hits += [f"{p}: {n[:6]!r}…" for n in needles if n in data]
    return hits


# --- trained runs shared by the session (chat, export-model, notify, the GUI's Try it) ----------------------------

PROMPT_TEMPLATE = "### Question:\n{question}\n### Answer:\n"
RESPONSE_TEMPLATE = "{answer}"


def write_qa_data(path: Path, n: int = 48) -> Path:
    """Question/answer records (small sums) as JSONL at ``path``."""
    rows = [{"question": f"What is {a} plus {b}?", "answer": f"{a} plus {b} is {a + b}."}
            for a in range(2, 10) for b in range(1, 7)][:n]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def full_config(root: Path, **sections) -> dict:
    """A 2-step full fine-tune of the demo model on the demo text."""
    cfg = tiny_config(name="full", training={"max_steps": 2}, checkpoints={"every_steps": 1, "keep_last": 5},
                      output={"tensorboard": False, "runs_dir": str(root / "runs"), "run_name": "full"})
    return _merge(cfg, sections)


def lora_config(root: Path, **sections) -> dict:
    """A 2-step LoRA run of the demo model on question/answer records through prompt/response templates."""
    data = write_qa_data(root / "qa.jsonl")
    cfg = tiny_config(name="lora", method={"type": "lora", "lora_r": 4, "lora_alpha": 8, "lora_dropout": 0.0},
                      data={"path": str(data), "seq_len": 64, "packing": False, "prompt_template": PROMPT_TEMPLATE,
                            "response_template": RESPONSE_TEMPLATE},
                      training={"max_steps": 2, "learning_rate": 5e-2},
                      checkpoints={"every_steps": 1, "keep_last": 5},
                      output={"tensorboard": False, "runs_dir": str(root / "runs"), "run_name": "lora"})
    return _merge(cfg, sections)


def train(root: Path, cfg: dict, env: dict | None = None) -> Path:
    """Train ``cfg`` with ``trainpilot-cli run``; returns the run directory (asserts it finished)."""
    path = write_config(root / f"{cfg['name']}.yaml", cfg)
    proc = cli("run", path, "--quiet", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return Path(cfg["output"]["runs_dir"]) / cfg["output"]["run_name"]


@functools.lru_cache(maxsize=None)
def trained_runs() -> dict[str, Path]:
    """``{"full": run_dir, "lora": run_dir}``, trained once per test session (shared by the xdist workers; tests
    that change a run copy it first)."""
    def build(root: Path) -> None:
        train(root, full_config(root))
        train(root, lora_config(root))

    root = shared_once("after-runs", build)
    return {name: root / "runs" / name for name in ("full", "lora")}


def write_jsonl(path: Path, rows: list[dict], repeat: int = 1) -> Path:
    """``rows`` as a JSON-lines file at ``path`` (``repeat`` times over); returns ``path``."""
    path.write_text("".join(json.dumps(r) + "\n" for _ in range(repeat) for r in rows), encoding="utf-8")
    return path
