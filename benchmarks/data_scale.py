"""Data at scale through the real CLI: cold and warm time to the first optimizer step, worker peak RSS,
and streaming's memory over a run.

    python benchmarks/data_scale.py                      # 1,000,000 records (~480 MB JSONL), CPU, tiny model
    python benchmarks/data_scale.py --records 100000     # a smaller file
    python benchmarks/data_scale.py --skip-streaming

It writes the JSONL itself (40–120 words a record, seeded), then runs ``python -m trainer run`` on it
with the demo tiny model, CPU, fp32, packing at seq_len 512, in a fresh ``TRAINPILOT_CACHE``:

- **cold**: nothing cached, ``training.max_steps`` set: the scan, then training starts as soon as the
  tokenizing process has written its first chunk (it goes on tokenizing while the model trains; the
  run ends after 2 steps, so most of the file is still untokenized when it exits).
- **epochs**: the same file with ``training.epochs: 1``: the schedule needs the exact number of
  sequences, so the worker waits until the whole file is tokenized (what the cold run left undone),
  then takes one step (stopped there by ``TRAINPILOT_INJECT_STOP``). Afterwards the cache is complete.
- **warm**: a run on the complete cache.
- **resume**: a warm run is stopped at step 1 (``TRAINPILOT_INJECT_STOP``), then ``resume`` is timed
  to its next step.
- **streaming**: ``data.streaming: true`` for ``--stream-steps`` steps; RSS after the first 10% of the
  steps against RSS at the end.

Times: from the CLI's start and from the worker process's start to the ``time`` of the first ``step``
event the run writes (seconds); ``data_seconds`` is the worker's own time in the data pipeline (from
its ``run_started`` event); ``worker_cpu_s_to_first_step`` the worker's CPU seconds until then (less
sensitive to a busy machine). A **baseline** run on a 200-record file first gives the fixed cost
(imports, planning, model build) that every run pays whatever the data. RSS: the worker process's resident memory, and with its child processes (the
tokenizing process) the tree's, sampled every 0.1 s by psutil (bytes), and its anonymous part (``RssAnon``: RSS
without pages of memory-mapped files, i.e. the Arrow cache the kernel may drop at any time). Targets from issue 11: cold ≤ 30 s,
warm ≤ 5 s, RSS ≤ 1.5 GB; streaming end RSS within 10% of RSS after 10% of the steps; issue 29: cold ≤ 20 s. The
worker starts early (trainer.supervisor.spawn.Standby); ``TRAINPILOT_NO_STANDBY=1`` in the environment measures
without it. The machine is shared: the load average at the start is printed with the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
WORDS = ("the a cat dog robot river bridge morning garden station engineer teacher builds finds paints carries "
         "watches helps opens quiet bright wooden long green old blue small young tall warm near under before "
         "after in at of and with from into over data model train step token sequence memory cache stream").split()


def generate(path: Path, n: int, seed: int = 0) -> None:
    """``n`` JSONL records ``{"text": ...}`` of 40–120 words (seeded)."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as fh:
        for _ in range(n):
            words = rng.choices(WORDS, k=rng.randint(40, 120))
            fh.write(json.dumps({"text": " ".join(words).capitalize() + "."}) + "\n")


def config(data: Path, runs: Path, max_steps: int | None, streaming: bool) -> dict:
    return {
        "schema_version": 1, "name": "datascale", "device": "cpu",
        "model": {"source": "demo-tiny-llama"},
        "data": {"path": str(data), "seq_len": 512, "packing": True, "streaming": streaming, "shuffle": True},
        "training": {"max_steps": max_steps, "epochs": 1, "effective_batch_size": 8, "micro_batch_size": 8,
                     "gradient_accumulation_steps": 1, "learning_rate": 1e-3, "seed": 7},
        "speed": {"precision": "fp32", "gradient_checkpointing": False},
        "deepspeed": {"enabled": False},
        "checkpoints": {"every_steps": 1000, "keep_last": 1, "save_final_model": False},
        "output": {"runs_dir": str(runs), "tensorboard": False},
    }


class Sampler(threading.Thread):
    """Samples the RSS of the worker (the supervisor's Python child running trainer.worker) and its children."""

    def __init__(self, cli: psutil.Process):
        super().__init__(daemon=True)
        self.cli, self.samples, self.worker_start, self.stop = cli, [], None, False

    def _worker(self):
        try:
            for p in self.cli.children(recursive=True):
                if "trainer.worker" in " ".join(p.cmdline()):
                    return p
        except psutil.Error:
            pass
        return None

    def run(self):
        worker, cpu = None, {}
        while not self.stop:
            worker = worker or self._worker()
            if worker is not None:
                self.worker_start = self.worker_start or worker.create_time()
                try:
                    own = worker.memory_info().rss
                    kids = worker.children(recursive=True)
                    tree = own + sum(c.memory_info().rss for c in kids)
                    for p in [worker, *kids]:  # children that exited keep their last figure
                        cpu[p.pid] = sum(p.cpu_times()[:2])
                    self.samples.append((time.time(), own, tree, sum(cpu.values()), _rss_anon(worker.pid)))
                except psutil.Error:
                    worker = None
            time.sleep(0.1)


def _rss_anon(pid: int) -> int:
    """Anonymous resident memory (bytes): RSS without the pages of memory-mapped files (the Arrow cache),
    which the kernel can drop at any time (Linux; 0 elsewhere)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_cli(args: list[str], env: dict) -> dict:
    start = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "trainer", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = Sampler(psutil.Process(proc.pid))
    sampler.start()
    out, err = proc.communicate()
    sampler.stop = True
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"trainpilot-cli {' '.join(args)} failed ({proc.returncode}):\n{err[-3000:]}")
    return {"start": start, "worker_start": sampler.worker_start, "samples": sampler.samples}


def events_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


def steps_of(run_dir: Path) -> list[dict]:
    return [e for e in events_of(run_dir) if e.get("type") == "step"]


def first_step(result: dict, run_dir: Path, after_step: int = 0) -> dict:
    step = next(e for e in steps_of(run_dir) if e["step"] > after_step)
    started = next((e for e in reversed(events_of(run_dir)) if e.get("type") == "run_started"), {})
    before = [s for s in result["samples"] if s[0] <= step["time"]]
    peak_own = max((s[1] for s in result["samples"]), default=0)
    peak_tree = max((s[2] for s in result["samples"]), default=0)
    return {"cli_to_first_step_s": round(step["time"] - result["start"], 2),
            "worker_to_first_step_s": round(step["time"] - result["worker_start"], 2) if result["worker_start"] else None,
            "worker_cpu_s_to_first_step": round(before[-1][3], 1) if before else None,
            "data_seconds": started.get("data_seconds"),
            "worker_peak_rss_gb": round(peak_own / 1e9, 3), "worker_tree_peak_rss_gb": round(peak_tree / 1e9, 3),
            "worker_peak_rss_anon_gb": round(max((s[4] for s in result["samples"]), default=0) / 1e9, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--workdir", default=None, help="keep files here (default: a temporary folder, removed)")
    ap.add_argument("--stream-steps", type=int, default=300)
    ap.add_argument("--skip-streaming", action="store_true")
    ap.add_argument("--streaming-only", action="store_true", help="only the streaming run (keeps the caches)")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tp-datascale-"))
    work.mkdir(parents=True, exist_ok=True)
    data, runs, cache = work / f"records-{args.records}.jsonl", work / "runs", work / "cache"
    if not data.exists():
        t = time.time()
        generate(data, args.records)
        print(f"generated {args.records:,} records, {data.stat().st_size / 1e6:.0f} MB in {time.time() - t:.0f} s", flush=True)
    if not args.streaming_only:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(runs, ignore_errors=True)
    env = dict(os.environ, TRAINPILOT_CACHE=str(cache), HF_DATASETS_CACHE=str(cache / "hf-datasets"),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if args.streaming_only:
        shutil.rmtree(runs / "stream", ignore_errors=True)
        print(json.dumps({"streaming": streaming(work, data, runs, env, args.stream_steps)}, indent=1))
        return
    cfg_file = work / "config.yaml"
    cfg_file.write_text(yaml.safe_dump(config(data, runs, 2, False)))
    figures = {"records": args.records, "bytes": data.stat().st_size, "cpus": os.cpu_count(),
               "load_average_at_start": os.getloadavg()[0]}
    tiny = work / "baseline.jsonl"
    generate(tiny, 200)
    base_cfg = work / "config-baseline.yaml"
    base_cfg.write_text(yaml.safe_dump(config(tiny, runs, 2, False)))
    res = run_cli(["run", str(base_cfg), "--run-dir", str(runs / "baseline"), "--quiet"], env)
    figures["baseline_200_records"] = first_step(res, runs / "baseline")
    print(f"baseline (200 records: imports, planning, model build): {figures['baseline_200_records']}", flush=True)
    epochs_cfg = work / "config-epochs.yaml"
    epochs_cfg.write_text(yaml.safe_dump(config(data, runs, None, False)))
    for name, cfg_path, extra in (("cold", cfg_file, {}), ("epochs", epochs_cfg, {"TRAINPILOT_INJECT_STOP": "1"}),
                                  ("warm", cfg_file, {})):
        run_dir = runs / name
        res = run_cli(["run", str(cfg_path), "--run-dir", str(run_dir), "--quiet"], dict(env, **extra))
        figures[name] = first_step(res, run_dir)
        print(f"{name}: {figures[name]}", flush=True)
    run_dir = runs / "resumed"
    run_cli(["run", str(cfg_file), "--run-dir", str(run_dir), "--quiet"], dict(env, TRAINPILOT_INJECT_STOP="1"))
    res = run_cli(["resume", str(run_dir), "--quiet"], env)
    figures["resume"] = first_step(res, run_dir, after_step=1)
    print(f"resume: {figures['resume']}", flush=True)
    if not args.skip_streaming:
        figures["streaming"] = streaming(work, data, runs, env, args.stream_steps)
        print(f"streaming: {figures['streaming']}", flush=True)
    print(json.dumps(figures, indent=1))
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


def streaming(work: Path, data: Path, runs: Path, env: dict, steps: int) -> dict:
    cfg_file = work / "config-stream.yaml"
    cfg_file.write_text(yaml.safe_dump(config(data, runs, steps, True)))
    run_dir = runs / "stream"
    res = run_cli(["run", str(cfg_file), "--run-dir", str(run_dir), "--quiet"], env)
    evs = steps_of(run_dir)
    t10 = next(e["time"] for e in evs if e["step"] >= max(1, steps // 10))
    at10 = [s for s in res["samples"] if s[0] <= t10][-1]
    at_end = [s for s in res["samples"] if s[0] <= evs[-1]["time"]][-1]
    return {"steps": steps, "rss_after_10pct_gb": round(at10[1] / 1e9, 3), "rss_at_end_gb": round(at_end[1] / 1e9, 3),
            "growth_pct": round(100 * (at_end[1] - at10[1]) / at10[1], 1),
            "rss_anon_after_10pct_gb": round(at10[4] / 1e9, 3), "rss_anon_at_end_gb": round(at_end[4] / 1e9, 3),
            **first_step(res, run_dir)}


if __name__ == "__main__":
    main()
