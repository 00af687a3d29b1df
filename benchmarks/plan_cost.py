"""What a plan costs: ``plan_run``'s own work (in this process, after the imports) and ``trainpilot-cli plan`` as the
separate process a user runs (imports included), for shipped architectures (their structure records are shipped)
on a recorded GPU; then the first plan of an architecture no record knows (one structure probe child) and the same
plan again (the record cached).

    python benchmarks/plan_cost.py [--repeat 5] [--hardware FILE] [--arch NAME ...] [--method lora]
                                   [--seq-len 2048] [--no-probe] [--json OUT]

The "new architecture" case is the shipped config of the first ``--arch`` with ``use_cache`` flipped: a config of
its own (another content hash), so no shipped or cached record matches and the probe runs, in a fresh cache folder.
Prints the median and the maximum in seconds (``plan_run``'s first call included: it reads the model's files).
These are measurements of this machine (say its load when you quote them); the tests assert what a plan decides,
never how long it takes.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer import config as tc  # noqa: E402
from trainer.core.paths import MODELS_DIR  # noqa: E402
from trainer.hardware.source import open_probe  # noqa: E402
from trainer.planning.plan import plan_run  # noqa: E402

DEFAULT_RECORDING = ROOT / "tests" / "fixtures" / "hardware" / "rtx4090_laptop_16gb.jsonl"
DEFAULT_ARCHS = ("qwen3-0.6b", "llama-3.1-8b", "qwen2.5-0.5b", "gemma-2-2b", "gemma-3-4b", "qwen3.5-0.8b",
                 "gpt-oss-20b", "qwen3-30b-a3b")


def _config(folder: Path, model: str, method: str, seq_len: int) -> Path:
    """A plan config for a shipped architecture name or a model folder (its config.json)."""
    key = "source" if Path(model).is_dir() else "architecture"
    path = folder / f"plan-{Path(model).name}.yaml"
    path.write_text(f"model:\n  {key}: {model}\n  tokenizer: demo\ndata:\n  path: demo\n  seq_len: {seq_len}\n"
                    f"method:\n  type: {method}\n", encoding="utf-8")
    return path


def own_work(cfg_path: Path, snap, repeat: int) -> list[float]:
    """Seconds of ``plan_run`` per call (the first call included: it reads the model's files and its record)."""
    cfg = tc.load(str(cfg_path), [])
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        plan_run(cfg, snap)
        out.append(time.perf_counter() - t0)
    return out


def as_a_user(cfg_path: Path, hardware: str, repeat: int, env: dict) -> tuple[list[float], dict]:
    """Seconds of each ``trainpilot-cli plan CONFIG --hardware FILE --json`` child (imports included), and the
    first one's plan."""
    out, first = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "trainer", "plan", str(cfg_path), "--hardware", hardware,
                               "--json"], capture_output=True, text=True, cwd=cfg_path.parent, env=env, timeout=1200)
        out.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"plan failed for {cfg_path.name}: {proc.stderr.strip()[-500:]}")
        first = first or json.loads(proc.stdout)
    return out, first


def _row(model: str, case: str, path: str, secs: list[float], plan: dict | None = None) -> dict:
    row = {"architecture": model, "case": case, "path": path, "median_s": statistics.median(secs),
           "max_s": max(secs), "n": len(secs)}
    if plan is not None:
        row["verdict"] = plan["verdict"]
        row["note"] = next((n for n in plan.get("notes", []) if "probe child" in n), "")
    return row


def _new_architecture(arch: str, folder: Path, args, snap, env: dict) -> list[dict]:
    """The first plan of a config no record knows (one probe child, a CLI process), then the same plan cached."""
    mine = folder / "my-model"
    mine.mkdir()
    cfg = json.loads((MODELS_DIR / f"{arch}.json").read_text(encoding="utf-8"))
    cfg["use_cache"] = not cfg.get("use_cache", True)
    (mine / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    cfg_path = _config(folder, str(mine), args.method, args.seq_len)
    model = f"{arch} (own copy)"
    secs, plan = as_a_user(cfg_path, args.hardware, 1, env)
    rows = [_row(model, "new architecture (probe child)", "trainpilot-cli plan", secs, plan)]
    secs, plan = as_a_user(cfg_path, args.hardware, args.repeat, env)
    rows.append(_row(model, "the same, cached", "trainpilot-cli plan", secs, plan))
    rows.append(_row(model, "the same, cached", "plan_run (own work)", own_work(cfg_path, snap, args.repeat)))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--hardware", default=str(DEFAULT_RECORDING))
    ap.add_argument("--arch", nargs="*", default=list(DEFAULT_ARCHS), help="shipped architectures")
    ap.add_argument("--method", default="lora", choices=("full", "lora", "qlora"))
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--no-probe", action="store_true", help="skip the new-architecture case (one probe child)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    probe = open_probe(args.hardware)
    snap = probe.snapshot()
    probe.close()
    rows = []
    print(f"{'architecture':<26} {'case':<32} {'path':<22} {'median s':>9} {'max s':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        os.environ["TRAINPILOT_CACHE"] = str(folder / "cache")  # this process and its children: a fresh cache
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        for arch in args.arch:
            cfg_path = _config(folder, arch, args.method, args.seq_len)
            rows.append(_row(arch, "shipped record", "plan_run (own work)", own_work(cfg_path, snap, args.repeat)))
            rows.append(_row(arch, "shipped record", "trainpilot-cli plan",
                             *as_a_user(cfg_path, args.hardware, args.repeat, env)))
            for r in rows[-2:]:
                print(f"{arch:<26} {r['case']:<32} {r['path']:<22} {r['median_s']:>9.3f} {r['max_s']:>7.3f}")
        if not args.no_probe and args.arch:
            for r in _new_architecture(args.arch[0], folder, args, snap, env):
                rows.append(r)
                print(f"{r['architecture']:<26} {r['case']:<32} {r['path']:<22} {r['median_s']:>9.3f} "
                      f"{r['max_s']:>7.3f}")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
