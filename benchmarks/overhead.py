"""Overhead of TrainPilot's worker against a bare HF ``transformers.Trainer``, measured in one run.

    python benchmarks/overhead.py                                   # CPU: tiny-llama, seq 128, micro 8
    python benchmarks/overhead.py --model llama-3.2-1b --device cuda --seq-len 2048 --micro-batch 4

Three variants, same model (random init, same seed), same tokenized data, same collator, same
``TrainingArguments`` (built by ``trainer.worker._training_arguments`` for both):

- **bare**: ``transformers.Trainer`` (not our subclass), a collator that drops our ``tp_real_tokens``
  key, none of our callbacks.
- **ours**: what ``trainer.worker`` trains with, built by ``trainer.worker._setup``: ``TrainPilotTrainer``
  (real-token counting, atomic checkpoint code) + the ``StepEvents`` callback (one ``step`` event
  appended to ``events.jsonl`` per optimizer step, the ``STOP`` file checked every step).
- **supervised** (child process): ``python -m trainer run`` on the same config, i.e. the supervisor
  (telemetry sampled at 1 Hz into ``telemetry.jsonl``, ``status.json`` rewritten per step event,
  ``train.log`` pumped) starting the worker. Timed from the worker's own ``step_seconds`` events.

bare and ours run in this process, side by side, one optimizer step each in turn (greenlets on one
OS thread; who goes first alternates per repeat), because the machine is shared and its speed drifts:
drift then hits both alike. Both get the same timing callback, added last. A step's time runs from
one ``on_step_begin`` to the next, so it holds the step and all that follows it (our callbacks,
logging, the event write, the STOP check, fetching the next batch). The first ``--warmup`` steps of
every run are dropped; the figure is the median steady-state step time over all repeats. Real
tokens are counted by the same collator wrapper for both (packed data: every token is real).
StepEvents' hooks are also timed in place: their cost directly, not as a difference of two noisy figures.
The supervised child runs after each pair, alone (not step-interleaved: noisier), and is compared
with the in-process bare figure; its startup (imports, planning, model build) is not in its figure:
only steady-state steps are compared (its ``step_seconds`` run from one ``on_step_end`` to the next:
also one full step period).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET = 0.98


def make_config(args, runs_dir: Path):
    """The run config both variants share (validated by the real schema)."""
    from trainer import config as config_mod

    return config_mod.validate({
        "schema_version": 1, "name": "overhead", "device": args.device,
        "model": {"source": "demo-tiny-llama", "architecture": args.model},
        "data": {"path": "demo", "seq_len": args.seq_len, "packing": True},
        "training": {"max_steps": args.steps, "effective_batch_size": args.micro_batch,
                     "micro_batch_size": args.micro_batch, "gradient_accumulation_steps": 1,
                     "learning_rate": 1e-3, "lr_scheduler": "constant", "warmup_steps": 0, "seed": 1},
        "speed": {"precision": "fp32" if args.device == "cpu" else "auto", "gradient_checkpointing": False},
        "deepspeed": {"enabled": False},
        # no checkpoint inside the measured steps, no final save: this measures training steps
        "checkpoints": {"every_steps": args.steps + 1, "keep_last": 1, "save_final_model": False},
        "output": {"tensorboard": args.tensorboard, "runs_dir": str(runs_dir)},
    })


class Turns:
    """Step-level interleaving: trainers take turns, one optimizer step each, so the machine's drift hits
    every variant alike. The turns are greenlets on ONE OS thread: torch's OpenMP team belongs to the
    calling thread, and two teams (two threads) spin against each other and double the step time.
    Without greenlet installed the trainers run one after the other (run-level alternation)."""

    def __init__(self, cuda: bool):
        try:
            import greenlet
        except ImportError:
            greenlet = None
        self.greenlet, self.cuda = greenlet, cuda
        self.mode = "steps (greenlets)" if greenlet else "runs (pip install greenlet for step-level)"

    def run(self, jobs: dict) -> None:
        """Run every ``name -> callable`` to the end, one step of each in turn (in the dict's order)."""
        if self.greenlet is None:
            for job in jobs.values():
                job()
            return
        self._main = self.greenlet.getcurrent()
        lets = {name: self.greenlet.greenlet(job) for name, job in jobs.items()}
        while lets:
            for name, g in list(lets.items()):
                g.switch()  # runs until that trainer's next step begins (or it ends; errors surface here)
                if g.dead:
                    del lets[name]

    def pause(self) -> None:
        """Give the turn back (called at a step boundary)."""
        if self.cuda:
            import torch

            torch.cuda.synchronize()  # the step's kernels belong to this turn, not the next
        if self.greenlet is not None:
            self._main.switch()

    def callback(self, counter: "CountingCollator", samples: list):
        """A TrainerCallback timing steps: each interval runs from one ``on_step_begin`` to the next, so it
        holds the step and everything after it (callbacks, logging, the event write, the next batch)."""
        from transformers import TrainerCallback

        turns, start = self, [None]

        class _CB(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                if start[0] is not None:
                    samples.append((time.perf_counter() - start[0], counter.take()))
                turns.pause()
                counter.take()  # tokens collated before this step's clock started are not this step's
                start[0] = time.perf_counter()

        return _CB()


class CountingCollator:
    """Wraps ``trainer.sequences.Collator``: counts real tokens; drops our key for the bare Trainer."""

    def __init__(self, inner, drop_key: bool):
        from trainer.worker.sequences import REAL_TOKENS_KEY

        self.inner, self.drop_key, self.key, self.tokens = inner, drop_key, REAL_TOKENS_KEY, 0

    def __call__(self, features):
        batch = self.inner(features)
        self.tokens += batch[self.key]
        if self.drop_key:
            del batch[self.key]
        return batch

    def take(self) -> int:
        """Tokens collated since the last call (the dataloader runs one batch ahead: constant for packed data)."""
        n, self.tokens = self.tokens, 0
        return n


SUPERVISOR_CPU: list[tuple[float, float]] = []  # (supervisor, worker) CPU seconds of each supervised run
CALLBACK_COST: list[float] = []  # seconds spent inside StepEvents' hooks, per optimizer step of "ours"


def _clock_hooks(steps) -> None:
    """Time StepEvents' per-step hooks in place (noise-free cost of our callback, seconds per step)."""
    spent = [0.0]

    def wrap(name):
        inner = getattr(steps, name)

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                spent[0] += time.perf_counter() - t
                if name == "on_log":  # on_log closes a step (it writes the step event)
                    CALLBACK_COST.append(spent[0])
                    spent[0] = 0.0
        setattr(steps, name, timed)

    for hook in ("on_step_end", "on_log"):
        wrap(hook)


def build_ours(cfg, run_dir: Path):
    """The worker's own trainer (``trainer.worker._setup``: TrainPilotTrainer + StepEvents) and its token counter."""
    from trainer.core import secrets
    from trainer.rundir.events import EVENTS_FILE, EventWriter
    from trainer.worker.main import _setup

    # the writer exactly as trainer.worker.main makes it (every line redacted of secrets)
    setup = _setup(cfg, run_dir, EventWriter(run_dir / EVENTS_FILE, redact=secrets.redact), rank=0)
    trainer = setup["trainer"]
    _clock_hooks(setup["steps"])
    counter = CountingCollator(trainer.data_collator, drop_key=False)  # TrainPilotTrainer pops the key itself
    trainer.data_collator = counter
    return trainer, counter


def build_bare(cfg, run_dir: Path):
    """A bare ``transformers.Trainer`` from the same pieces (model, data, collator, arguments) and its counter."""
    from transformers import Trainer

    from trainer.worker import modeling, sequences
    from trainer.worker.main import _training_arguments

    use_cuda = cfg.device == "cuda"
    precision = cfg.speed.precision if cfg.speed.precision != "auto" else ("bf16" if use_cuda else "fp32")
    os.environ["TENSORBOARD_LOGGING_DIR"] = str(run_dir / "tensorboard")
    tokenizer = modeling.load_tokenizer(cfg)
    train_ds, eval_ds, _ = sequences.build_datasets(cfg, tokenizer)
    model = modeling.load_model(cfg, precision, use_cuda)
    counter = CountingCollator(sequences.Collator(tokenizer.pad_token_id), drop_key=True)
    trainer = Trainer(model=model, args=_training_arguments(cfg, run_dir, precision, use_cuda),
                      train_dataset=train_ds, eval_dataset=eval_ds, data_collator=counter, processing_class=tokenizer)
    return trainer, counter


def run_pair(cfg, work: Path, r: int, warmup: int, turns: Turns) -> dict[str, list[tuple[float, int]]]:
    """Train bare and ours side by side, one step each in turn (who goes first alternates with ``r``);
    returns each one's steady-state (seconds, tokens) per step."""
    order = ["bare", "ours"] if r % 2 == 0 else ["ours", "bare"]
    built = {name: (build_bare if name == "bare" else build_ours)(cfg, work / f"{name}-{r}") for name in order}
    samples = {name: [] for name in order}
    for name, (trainer, counter) in built.items():
        trainer.add_callback(turns.callback(counter, samples[name]))  # last: after StepEvents
    turns.run({name: built[name][0].train for name in order})
    return {name: s[max(0, warmup - 1):] for name, s in samples.items()}


def run_supervised(cfg, run_dir: Path, warmup: int) -> list[tuple[float, int]]:
    """``python -m trainer run`` in a child process; steady-state (step_seconds, tokens) from its step events."""
    from trainer import config as config_mod
    from trainer.rundir.events import EVENTS_FILE, read_events

    cfg_path = run_dir.parent / f"{run_dir.name}.yaml"
    cfg_path.write_text(config_mod.dump_yaml(cfg))
    err_file = run_dir.parent / f"{run_dir.name}.stderr.txt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "run", str(cfg_path), "--run-dir", str(run_dir),
                             "--quiet"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err_file.open("w"))
    cpu = _watch_cpu(proc)
    if proc.wait() != 0:
        raise RuntimeError(f"supervised run failed (exit {proc.returncode}): {err_file.read_text()[-2000:]}")
    if cpu:
        SUPERVISOR_CPU.append(cpu)
    steps = [e for e in read_events(run_dir / EVENTS_FILE) if e.get("type") == "step"]
    # step 1's interval starts at on_train_begin (not comparable): drop it like the in-process first mark
    return [(e["step_seconds"], round(e["tokens_per_second"] * e["step_seconds"])) for e in steps[1:]][max(0, warmup - 1):]


def _watch_cpu(proc) -> tuple[float, float] | None:
    """CPU seconds (user + system) of the supervisor itself and of its worker, last seen before they exit."""
    try:
        import psutil
    except ImportError:
        return None
    sup, worker = None, None
    try:
        p = psutil.Process(proc.pid)
        while proc.poll() is None:
            t = p.cpu_times()
            sup = t.user + t.system
            for child in p.children():
                c = child.cpu_times()
                worker = c.user + c.system
            time.sleep(0.25)
    except psutil.Error:  # it exited between two looks: keep the last figures
        pass
    return (sup, worker) if sup is not None and worker else None


def summarise(samples: list[tuple[float, int]]) -> dict:
    """Median step seconds, median tokens per step and tokens/s of steady-state steps."""
    secs = [s for s, _ in samples]
    tokens = statistics.median(t for _, t in samples)
    med = statistics.median(secs)
    return {"steps": len(samples), "median_step_seconds": med, "tokens_per_step": tokens,
            "tokens_per_second": tokens / med, "spread_seconds": [min(secs), max(secs)]}


def measure(args) -> dict:
    """Run every variant ``args.repeats`` times, interleaved; return per-repeat and pooled figures."""
    work = Path(tempfile.mkdtemp(prefix="tp-overhead-"))
    cfg = make_config(args, work)
    variants = ["bare", "ours"] + ([] if args.no_supervised else ["supervised"])
    pooled = {name: [] for name in variants}
    repeats = []
    turns = Turns(args.device == "cuda")
    for r in range(args.repeats):
        got = run_pair(cfg, work, r, args.warmup, turns)
        if "supervised" in variants:
            got["supervised"] = run_supervised(cfg, work / f"supervised-{r}", args.warmup)
        row = {}
        for name, samples in got.items():
            pooled[name] += samples
            row[name] = summarise(samples)
            print(f"repeat {r + 1}/{args.repeats} {name:>10}: {row[name]['median_step_seconds'] * 1e3:8.2f} ms/step "
                  f"{row[name]['tokens_per_second']:10.1f} tok/s", flush=True)
        repeats.append(row)
    pooled_sum = {name: summarise(s) for name, s in pooled.items()}
    bare = pooled_sum["bare"]["tokens_per_second"]
    ratios = {name: pooled_sum[name]["tokens_per_second"] / bare for name in pooled_sum if name != "bare"}
    per_repeat = {name: [row[name]["tokens_per_second"] / row["bare"]["tokens_per_second"] for row in repeats]
                  for name in ratios}
    cost = sorted(CALLBACK_COST)
    pooled_sum["ours"]["callback_seconds_per_step"] = statistics.median(cost) if cost else None
    if SUPERVISOR_CPU:
        sup, wk = (statistics.median(x[i] for x in SUPERVISOR_CPU) for i in (0, 1))
        pooled_sum["supervised"].update(supervisor_cpu_seconds=sup, worker_cpu_seconds=wk)
    return {"meta": dict(_meta(args), interleaving=turns.mode), "pooled": pooled_sum, "ratio_vs_bare": ratios, "ratio_per_repeat": per_repeat,
            "repeats": repeats, "target": TARGET, "work_dir": str(work)}


def _meta(args) -> dict:
    import torch
    import transformers

    device = torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or platform.machine()
    return {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "device": device,
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
            "settings": {k: v for k, v in vars(args).items() if k != "json"}}


def report(res: dict) -> None:
    """Print the figures and what each variant includes."""
    m = res["meta"]
    print(f"\n{m['date_utc']} UTC  device {m['device']}  ({m['cpu_count']} CPUs, torch {m['torch']}, "
          f"transformers {m['transformers']})")
    s = m["settings"]
    print(f"model {s['model']}  seq {s['seq_len']}  micro-batch {s['micro_batch']}  steps {s['steps']} "
          f"(first {s['warmup']} dropped) x {s['repeats']} repeats  tensorboard {'on' if s['tensorboard'] else 'off'} "
          f"(both)  logging_steps=1 (both)  interleaved by {m['interleaving']}")
    print(f"{'variant':>11} {'steps':>6} {'median ms/step':>15} {'tok/s':>10} {'vs bare':>8}  per repeat")
    for name, p in res["pooled"].items():
        ratio = res["ratio_vs_bare"].get(name, 1.0)
        reps = " ".join(f"{x:.3f}" for x in res["ratio_per_repeat"].get(name, []))
        print(f"{name:>11} {p['steps']:>6} {p['median_step_seconds'] * 1e3:>15.2f} {p['tokens_per_second']:>10.1f} "
              f"{ratio:>8.3f}  {reps}")
    print("bare       = transformers.Trainer, same model/data/collator/TrainingArguments, no TrainPilot callbacks")
    print("ours       = TrainPilotTrainer + StepEvents (step event per step, STOP-file check per step), in-process")
    if "supervised" in res["pooled"]:
        print("supervised = python -m trainer run (supervisor: 1 Hz telemetry, status.json, train.log) in a child "
              "process; steady-state step_seconds from its events, startup not included")
    ours = res["ratio_vs_bare"]["ours"]
    cost = res["pooled"]["ours"]["callback_seconds_per_step"]
    if cost is not None:
        print(f"StepEvents hooks (on_step_end + on_log) take {cost * 1e6:.0f} us per step (median, timed in place) "
              f"= {cost / res['pooled']['bare']['median_step_seconds']:.2%} of a bare step")
    sv = res["pooled"].get("supervised", {})
    if "supervisor_cpu_seconds" in sv:
        print(f"supervisor process CPU {sv['supervisor_cpu_seconds']:.2f} s per run (imports and planning included) vs "
              f"its worker's {sv['worker_cpu_seconds']:.1f} s ({sv['supervisor_cpu_seconds'] / sv['worker_cpu_seconds']:.1%})")
    print(f"ours/bare tokens/s ratio: {ours:.3f} (target >= {res['target']})")


def main(argv=None) -> int:
    """Parse options, measure, print, optionally write JSON. Returns the exit code (0 unless it failed to run)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-llama", help="architecture name in trainer/resources/models (random init)")
    ap.add_argument("--steps", type=int, default=40, help="optimizer steps per run")
    ap.add_argument("--warmup", type=int, default=5, help="first steps of each run not counted")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every variant")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--tensorboard", action="store_true", help="TensorBoard logging on for every variant")
    ap.add_argument("--no-supervised", action="store_true", help="skip the child-process variant")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args(argv)
    if args.steps <= args.warmup + 1:
        ap.error("--steps must exceed --warmup + 1")
    res = measure(args)
    report(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
