"""What planning costs: ``plan_run`` on models whose structure record is shipped or cached (the planner's own
work), ``trainpilot-cli plan`` as a separate process (what a user waits for), and the first plan of an
architecture no record knows (one structure probe child).

    python benchmarks/plan_cost.py [--repeat 5] [--models qwen3-0.6b,gpt-oss-20b] [--json OUT]

The "new architecture" case is the shipped config of the first model with ``use_cache`` flipped: a config of its
own (another content hash), so no shipped or cached record matches and the probe runs, in a fresh cache folder.
Measurements of this machine (median seconds; the hardware is the 16 GB laptop recording).
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

LAPTOP = ROOT / "tests" / "fixtures" / "hardware" / "rtx4090_laptop_16gb.jsonl"
DEFAULT = "qwen3-0.6b,llama-3.1-8b,gemma-3-4b,qwen3.5-0.8b,gpt-oss-20b,qwen3-30b-a3b"


def _config(folder: Path, source: str) -> Path:
    path = folder / f"plan-{Path(source).name}.yaml"
    path.write_text(f"model:\n  source: {source}\n  tokenizer: demo\ndata:\n  path: demo\n  seq_len: 2048\n"
                    "method:\n  type: lora\n")
    return path


def in_process(cfg_path: Path, snap, repeat: int) -> float:
    """Median seconds of ``plan_run`` (the planner's own work; the spec is parsed once, as in a real process)."""
    cfg = tc.load(str(cfg_path), [])
    plan_run(cfg, snap)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        plan_run(cfg, snap)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cli(cfg_path: Path, env: dict) -> tuple[float, dict]:
    """Seconds of one ``trainpilot-cli plan --json`` child and its plan."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "trainer", "plan", str(cfg_path), "--hardware", str(LAPTOP), "--json"],
                         capture_output=True, text=True, env=env, timeout=1200)
    seconds = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(out.stderr[-2000:])
    return seconds, json.loads(out.stdout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--models", default=DEFAULT, help="shipped architectures, comma-separated")
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args(argv)
    probe = open_probe(str(LAPTOP))
    snap = probe.snapshot()
    probe.close()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        os.environ["TRAINPILOT_CACHE"] = str(folder / "cache")  # this process and its children: a fresh cache
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        for name in args.models.split(","):
            cfg_path = _config(folder, name)
            wall, plan = cli(cfg_path, env)
            rows.append({"model": name, "case": "shipped record", "plan_run_s": in_process(cfg_path, snap, args.repeat),
                         "cli_s": wall, "verdict": plan["verdict"]})
        first = args.models.split(",")[0]
        mine = folder / "my-model"
        mine.mkdir()
        cfg = json.loads((MODELS_DIR / f"{first}.json").read_text())
        cfg["use_cache"] = not cfg.get("use_cache", True)
        (mine / "config.json").write_text(json.dumps(cfg))
        cfg_path = _config(folder, str(mine))
        for case in ("new architecture (probe child)", "the same, cached"):
            wall, plan = cli(cfg_path, env)
            note = next((n for n in plan["notes"] if "probe child" in n), "")
            rows.append({"model": f"{first} (own copy)", "case": case, "cli_s": wall, "verdict": plan["verdict"],
                         "plan_run_s": in_process(cfg_path, snap, args.repeat) if "cached" in case else None,
                         "note": note})
    print(f"{'model':<24} {'case':<32} {'plan_run s':>10} {'CLI s':>7}  verdict")
    for r in rows:
        own = "" if r["plan_run_s"] is None else f"{r['plan_run_s']:.3f}"
        print(f"{r['model']:<24} {r['case']:<32} {own:>10} {r['cli_s']:>7.2f}  {r['verdict']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
