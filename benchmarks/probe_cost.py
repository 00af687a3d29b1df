"""How much the GPU probe costs: one full snapshot (with the process list) and one light sample.

    python benchmarks/probe_cost.py [--repeat 50] [--hardware FILE] [--json OUT]

Measures the live path on this machine (NVML when an NVIDIA driver is present, otherwise the
no-GPU path that reads host values only) and the replay path of a recording. Prints the median
and 95th percentile in milliseconds. These are measurements of this machine, nothing else.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.hardware.source import open_probe  # noqa: E402

DEFAULT_RECORDING = ROOT / "tests" / "fixtures" / "hardware" / "rtx4090_laptop_16gb.jsonl"


def timed(fn, repeat: int) -> dict:
    """Median and p95 of ``fn()`` in milliseconds over ``repeat`` calls (after one warm-up call)."""
    fn()
    ms = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t0) * 1000.0)
    ms.sort()
    return {"median_ms": statistics.median(ms), "p95_ms": ms[min(len(ms) - 1, int(0.95 * len(ms)))], "n": repeat}


def measure(label: str, hardware: str | None, repeat: int) -> list[dict]:
    t0 = time.perf_counter()
    probe = open_probe(hardware)
    open_ms = (time.perf_counter() - t0) * 1000.0
    snap = probe.snapshot()
    what = f"{len(snap.gpus)} GPU(s)" + (f", {snap.note}" if snap.note else "")
    rows = [{"path": label, "call": "open_probe", "median_ms": open_ms, "p95_ms": open_ms, "n": 1, "what": what},
            {"path": label, "call": "snapshot (full)", **timed(probe.snapshot, repeat), "what": what},
            {"path": label, "call": "sample (light)", **timed(probe.sample, repeat), "what": what}]
    probe.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--hardware", default=str(DEFAULT_RECORDING), help="recording for the replay path")
    ap.add_argument("--json", metavar="OUT", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    rows = measure("live", None, args.repeat) + measure("replay", args.hardware, args.repeat)
    print(f"probe cost on {platform.node()} ({platform.system()}, Python {platform.python_version()})")
    print(f"{'path':<7} {'call':<16} {'median ms':>10} {'p95 ms':>8}  what")
    for r in rows:
        print(f"{r['path']:<7} {r['call']:<16} {r['median_ms']:>10.3f} {r['p95_ms']:>8.3f}  {r['what']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": platform.node(), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
