"""What a plan costs: ``plan_run``'s own work (in this process, after the imports) and ``trainpilot-cli plan`` as the
separate process a user runs (imports included), for shipped architectures on a recorded GPU.

    python benchmarks/plan_cost.py [--repeat 5] [--hardware FILE] [--arch NAME ...] [--json OUT]

Prints the median and the maximum in seconds. These are measurements of this machine (say its load when you quote
them); the tests assert what a plan decides, never how long it takes.
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

from trainer import config as config_mod  # noqa: E402
from trainer.hardware.source import open_probe  # noqa: E402
from trainer.planning.plan import plan_run  # noqa: E402

DEFAULT_RECORDING = ROOT / "tests" / "fixtures" / "hardware" / "rtx4090_laptop_16gb.jsonl"
DEFAULT_ARCHS = ("llama-3.1-8b", "qwen2.5-0.5b", "gemma-2-2b")


def own_work(arch: str, hardware: str, repeat: int) -> list[float]:
    """Seconds of ``plan_run`` per call (the first call included: it reads the model's files)."""
    hw = open_probe(hardware).snapshot()
    cfg = config_mod.validate({"model": {"architecture": arch}})
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        plan_run(cfg, hw)
        out.append(time.perf_counter() - t0)
    return out


def as_a_user(arch: str, hardware: str, repeat: int) -> list[float]:
    """Seconds of ``trainpilot-cli plan CONFIG --hardware FILE`` as a child process (imports included)."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "plan.yaml"
        cfg.write_text(f"model:\n  architecture: {arch}\n", encoding="utf-8")
        out = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "trainer", "plan", str(cfg), "--hardware", hardware],
                                  capture_output=True, text=True, cwd=tmp, env=dict(os.environ, PYTHONPATH=str(ROOT)))
            out.append(time.perf_counter() - t0)
            if proc.returncode != 0:
                raise SystemExit(f"plan failed for {arch}: {proc.stderr.strip()[-500:]}")
        return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--hardware", default=str(DEFAULT_RECORDING))
    ap.add_argument("--arch", nargs="*", default=list(DEFAULT_ARCHS))
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    rows = []
    print(f"{'architecture':<16} {'path':<22} {'median s':>9} {'max s':>7}")
    for arch in args.arch:
        for path, fn in (("plan_run (own work)", own_work), ("trainpilot-cli plan", as_a_user)):
            secs = fn(arch, args.hardware, args.repeat)
            rows.append({"architecture": arch, "path": path, "median_s": statistics.median(secs), "max_s": max(secs),
                         "n": len(secs)})
            print(f"{arch:<16} {path:<22} {statistics.median(secs):>9.3f} {max(secs):>7.3f}")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
