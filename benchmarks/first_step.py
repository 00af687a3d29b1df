"""Seconds from `trainpilot-cli run` to the first optimizer step, one run, warm or cold: the figure to compare two
versions of the code in turn on a shared machine (farm-bench alternates them; each run appends one JSON line).

    python benchmarks/first_step.py --root /work/main --mode warm --out figures.jsonl --workdir DIR
    farm-bench -n 5 --vs "python benchmarks/first_step.py --root /work/main --mode cold --out f.jsonl --workdir DIR" \
        -- python benchmarks/first_step.py --root . --mode cold --out f.jsonl --workdir DIR

The config is ``benchmarks/data_scale.py``'s (demo tiny model, CPU, packing at 512, 1,000,000 generated records
written into ``--workdir`` when missing) with ``training.max_steps: 1``; ``--root`` is the code that runs (its
folder goes on PYTHONPATH). **warm** uses ``--workdir``/cache, which must hold the complete cache (run
``data_scale.py --workdir DIR`` once, or ``--prepare`` here: a ``training.epochs`` run that tokenizes the whole file);
**cold** uses a new empty cache every run (the scan, then the first chunk). The line: ``cli_to_first_step_s``,
``cli_to_run_started_s``, ``data_seconds``, ``load_at_start`` (the 1-minute load average), ``code`` (--root).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import data_scale  # noqa: E402  (the benchmark's data and config)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(data_scale.REPO), help="the code to run (a checkout of TrainPilot)")
    ap.add_argument("--mode", choices=("warm", "cold"), default="warm")
    ap.add_argument("--out", required=True, help="append the figures here (JSON lines)")
    ap.add_argument("--workdir", required=True, help="holds the records file and the warm cache")
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--prepare", action="store_true", help="tokenize the whole file into the warm cache first")
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    data = work / f"records-{args.records}.jsonl"
    if not data.exists():
        data_scale.generate(data, args.records)
    if args.prepare:
        _run(args.root, work, data, work / "cache", None, dict(TRAINPILOT_INJECT_STOP="1"))
    cache = work / "cache" if args.mode == "warm" else Path(tempfile.mkdtemp(prefix="cold-cache-", dir=work))
    try:
        rec = _run(args.root, work, data, cache, 1, {})
    finally:
        if args.mode == "cold":
            shutil.rmtree(cache, ignore_errors=True)
    rec.update(code=str(args.root), mode=args.mode)
    with open(args.out, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(rec) + "\n")
    print(json.dumps(rec))


def _run(root: str, work: Path, data: Path, cache: Path, max_steps: int | None, extra: dict) -> dict:
    """One CLI run to its end; the figures of its first step."""
    folder = Path(tempfile.mkdtemp(prefix="first-step-", dir=work))
    cfg = folder / "config.yaml"
    cfg.write_text(yaml.safe_dump(data_scale.config(data, folder / "runs", max_steps, False)))
    env = dict(os.environ, PYTHONPATH=str(Path(root).resolve()), TRAINPILOT_CACHE=str(cache),
               HF_DATASETS_CACHE=str(cache / "hf-datasets"), **extra)
    load, start = os.getloadavg()[0], time.time()
    proc = subprocess.run([sys.executable, "-m", "trainer", "run", str(cfg), "--run-dir", str(folder / "run"),
                           "--quiet"], env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True)
    try:
        if proc.returncode != 0:
            raise SystemExit(f"trainpilot-cli run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        events = data_scale.events_of(folder / "run")
        step = next(e for e in events if e.get("type") == "step")
        started = next(e for e in events if e.get("type") == "run_started")
        return {"cli_to_first_step_s": round(step["time"] - start, 2),
                "cli_to_run_started_s": round(started["time"] - start, 2),
                "data_seconds": started.get("data_seconds"), "load_at_start": round(load, 1)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
