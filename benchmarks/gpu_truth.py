"""Does the plan hold on a real GPU? ``trainpilot-cli run`` for a matrix of rows under each recorded card.

    python benchmarks/gpu_truth.py --out docs/bench/gpu_truth.json                  # on an NVIDIA GPU
    python benchmarks/gpu_truth.py --dry --measure-data                            # any machine: the planned column
    python benchmarks/gpu_truth.py --list                                          # the rows and cards, numbered
    python benchmarks/gpu_truth.py --only 0-5 --cards rtx4090_laptop_16gb --out part.json   # a part of the matrix
    python benchmarks/gpu_truth.py --only 10-11 --out long.json                    # the long-context rows only

Rows: a full fine-tune, LoRA, QLoRA of an 8B model, 8-bit AdamW (``plan_allow_approximate``), activation offload,
``torch.compile``, DPO, KTO and GRPO, Llama-3.1-8B QLoRA at the longest context the planner fits on the laptop
(with nothing else on it) and the desktop (issue 32; each on its own card only), and issue 39's full fine-tunes with
the optimizer step fused into backward (Llama-3.1-8B on the desktop, its tokens/s beside torchtune's 1,650 on an RTX
4090 scaled by the cards' bf16 peaks; Qwen3-4B and Qwen2.5-1.5B with fp32 paged states on the laptop) — shipped architectures with random weights, the bundled demo tokenizer and
synthetic data written here (ten-word preference records, short prompts, documents longer than any planned
sequence), so nothing is downloaded. Each row is
planned for every recorded card in ``tests/fixtures/hardware/`` (``--hardware``, as a user would) and run through
the CLI as a separate process. The card is emulated on a bigger one: the worker's caching allocator is capped, at
its first CUDA initialisation, to the recording's free memory minus this machine's bare CUDA context
(``torch.cuda.set_per_process_memory_fraction``, from a ``sitecustomize`` this script puts on the children's
``PYTHONPATH``), and the truth is NVML's device-used rise over the run, polled every 0.1 s (what nvidia-smi shows:
context, kernels and library workspaces included). Printed per row: planned and used GiB, the error, tokens/s, the
verdict, and every out-of-memory among "fits"; used above the recording's free memory would not have fitted the real
card even where the bigger one let it run. Without an NVIDIA GPU (and without ``--dry``) it says so and exits 0.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer import config as config_mod  # noqa: E402
from trainer.config.placements import DEFAULT, find  # noqa: E402
from trainer.core import entrypoints  # noqa: E402
from trainer.core.units import GIB  # noqa: E402
from trainer.hardware.source import open_probe  # noqa: E402
from trainer.planning.budget import close_apps  # noqa: E402
from trainer.planning.longest import longest, without_apps  # noqa: E402
from trainer.planning.plan import plan_run  # noqa: E402

CARDS_DIR = ROOT / "tests" / "fixtures" / "hardware"
CAP_ENV = "TRAINPILOT_BENCH_CAP_BYTES"
STEPS = 8  # optimizer steps per run: enough for the peak and a tokens/s median after the first two
ROW_TIMEOUT_S = 540

# The worker's allocator cap, installed when torch.cuda first initialises (any child that never touches CUDA is
# unaffected). torch.cuda._lazy_call queues a call for that moment; the finder waits for torch itself to load.
SITECUSTOMIZE = '''
import importlib.abc, importlib.machinery, os, sys

class _CapAfterTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "torch" or "torch" in sys.modules:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            cap = int(os.environ["%s"])
            module.cuda._lazy_call(lambda: module.cuda.set_per_process_memory_fraction(
                min(1.0, cap / module.cuda.get_device_properties(0).total_memory)))
        spec.loader.exec_module = exec_module
        return spec

if os.environ.get("%s"):
    sys.meta_path.insert(0, _CapAfterTorch())
''' % (CAP_ENV, CAP_ENV)


def row(name: str, arch: str, cards: tuple = (), longest: bool = False, reference: tuple = (), **sections) -> dict:
    """One row: a name and the config a user would write (everything the planner may choose left ``auto``);
    ``cards`` limits it to those cards (file stems, a derived ``-apps-closed`` one included); ``longest`` plans it at
    the longest ``data.seq_len`` that fits the card (``trainer.planning.longest``), found when it is planned;
    ``reference`` a published (who, tokens/s, card) to print beside the measured tokens/s, scaled by the cards' bf16
    peaks (``speed.peak_flops``)."""
    cfg = {"schema_version": 1, "name": f"truth-{name}", "device": "cuda", "model": {"architecture": arch},
           "data": {"path": "demo", "seq_len": 2048}, "speed": {"precision": "bf16"},
           "training": {"max_steps": STEPS, "effective_batch_size": 16, "learning_rate": 1e-4, "warmup_steps": 0},
           "checkpoints": {"every_steps": 1000, "save_final_model": False}, "output": {"tensorboard": False}}
    for key, value in sections.items():
        if isinstance(value, dict):
            cfg.setdefault(key, {}).update(value)
        else:
            cfg[key] = value
    return {"name": name, "config": cfg, "cards": tuple(cards), "longest": longest, "reference": tuple(reference)}


# Issue 32's long-context rows: Llama-3.1-8B QLoRA rank 32, micro-batch 1, one synthetic document per sequence
# (longer than any planned length: packing off, each cut to seq_len, so attention needs no mask), planned at the
# longest context the card fits: the laptop with nothing else on it (its free memory plus what firefox held) and the
# desktop. One micro-batch per optimizer step, a few steps (a 48k-token step of an 8B model: ~10-20 s on an H100).
LONG = dict(method={"type": "qlora", "lora_r": 32}, data={"path": "@long", "packing": False},
            training={"micro_batch_size": 1, "effective_batch_size": 1})


# torchtune's llama3_1/8B_full_single_device: Llama-3.1-8B full fine-tune on one RTX 4090, 1,650 tokens/s (its README)
TORCHTUNE_8B = ("torchtune", 1650.0, "RTX 4090")

ROWS = [
    row("full", "llama-3.2-1b"),
    row("lora", "llama-3.2-3b", method={"type": "lora"}),
    row("qlora-8b", "llama-3.1-8b", method={"type": "qlora"}),
    row("qlora-8b-8k", "llama-3.1-8b", method={"type": "qlora"}, data={"seq_len": 8192}),
    row("adamw-8bit", "llama-3.2-3b", plan_allow_approximate=True, speed={"activation_offload": False}),
    row("offload", "llama-3.2-1b", training={"micro_batch_size": 4, "gradient_accumulation_steps": 4},
        speed={"gradient_checkpointing": False, "activation_offload": True}),
    row("compile", "llama-3.2-1b", speed={"torch_compile": True}),
    row("dpo", "llama-3.2-1b", method={"type": "lora"}, data={"path": "@pairs", "packing": False},
        training={"objective": "dpo"}),
    row("kto", "llama-3.2-1b", method={"type": "lora"}, data={"path": "@kto", "packing": False},
        training={"objective": "kto"}),
    row("grpo", "qwen2.5-0.5b", method={"type": "lora"}, data={"path": "@prompts", "seq_len": 512},
        training={"objective": "grpo", "max_steps": 4}, grpo={"num_generations": 8, "max_completion_length": 256},
        rewards={"exact_answer": 1.0}),
    row("long-8b-laptop", "llama-3.1-8b", cards=("rtx4090_laptop_16gb-apps-closed",), longest=True,
        **{**LONG, "training": {**LONG["training"], "max_steps": 3}}),
    row("long-8b-desktop", "llama-3.1-8b", cards=("desktop_24gb",), longest=True,
        **{**LONG, "training": {**LONG["training"], "max_steps": 2}}),
    row("qlora-8b-16k", "llama-3.1-8b", method={"type": "qlora", "lora_r": 32}, data={"seq_len": 16384},
        training={"effective_batch_size": 2, "micro_batch_size": 1}),
    # issue 39: full fine-tunes with the optimizer step fused into backward (effective batch 8, one micro-batch)
    row("full-8b-fused", "llama-3.1-8b", cards=("desktop_24gb",), plan_allow_approximate=True,
        training={"effective_batch_size": 8}, reference=TORCHTUNE_8B),
    row("full-4b-fused", "qwen3-4b", cards=("rtx4090_laptop_16gb",), plan_allow_approximate=True,
        training={"effective_batch_size": 8}),
    row("full-1.5b-paged32", "qwen2.5-1.5b", cards=("rtx4090_laptop_16gb",),
        training={"effective_batch_size": 8, "optimizer": find(paged=True, eight_bit=False).name,
                  "optimizer_in_backward": True, "max_grad_norm": 0}),
]
LONG_DOC_WORDS = 160_000  # words per synthetic document: more tokens than any planned length (131,072 at most)

WORDS = ["red", "green", "blue", "black", "white", "gold", "grey", "brown", "house", "river", "tree", "road"]


def write_data(folder: Path) -> dict:
    """The synthetic data files the rows name with ``@``: ten-word preference pairs, KTO records, short prompts."""
    folder.mkdir(parents=True, exist_ok=True)
    pairs, kto, prompts = [], [], []
    for i in range(256):
        a, b, c = WORDS[i % 12], WORDS[(i * 5 + 1) % 12], WORDS[(i * 7 + 3) % 12]
        prompt = f"The {a} {b} is {c}. What colour is it?"
        pairs.append({"prompt": prompt, "chosen": f" It is {c}, I think.", "rejected": f" Maybe it is {a}."})
        kto.append({"prompt": prompt, "completion": pairs[-1]["chosen" if i % 2 else "rejected"], "label": bool(i % 2)})
        prompts.append({"prompt": f"Name the last word: {a} {b} {c}", "answer": c})
    files = {}
    for name, rows in (("pairs", pairs), ("kto", kto), ("prompts", prompts), ("long", long_documents())):
        files[f"@{name}"] = folder / f"{name}.jsonl"
        files[f"@{name}"].write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return files


def long_documents(count: int = 4) -> list[dict]:
    """``count`` text records of ``LONG_DOC_WORDS`` words each (a varied word order, so the tokenizer sees real
    text), each longer than any sequence a long-context row plans."""
    import random

    rng = random.Random(32)
    return [{"text": " ".join(rng.choice(WORDS) for _ in range(LONG_DOC_WORDS)) + "."} for _ in range(count)]


def config_of(r: dict, files: dict):
    """The row's RunConfig with its data file in place."""
    cfg = json.loads(json.dumps(r["config"]))
    cfg["data"]["path"] = str(files.get(cfg["data"]["path"], cfg["data"]["path"]))
    return config_mod.validate(cfg)


def cards(names: list[str] | None, work: Path) -> dict:
    """Recorded cards with a GPU, by file stem (``--cards`` keeps some), and for a card where programs hold VRAM the
    same card with them closed (``<stem>-apps-closed``: a recording written into ``work``)."""
    found = {}
    for f in sorted(CARDS_DIR.glob("*.jsonl")):
        snap = open_probe(str(f)).snapshot()
        if not snap.gpus:
            continue
        found[f.stem] = (f, snap)
        apps = [a for a in close_apps(snap.gpus[0]) if a["used_memory_bytes"]]
        if apps:
            closed = without_apps(snap, apps)
            path = work / "cards" / f"{f.stem}-apps-closed.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            head = {"recording": {"kind": "derived", "description": f"{f.stem} with "
                                  f"{', '.join(a['name'] for a in apps)} closed (benchmarks/gpu_truth.py)"}}
            path.write_text(json.dumps(head) + "\n" + json.dumps(closed.to_dict()) + "\n", encoding="utf-8")
            found[f"{f.stem}-apps-closed"] = (path, open_probe(str(path)).snapshot())
    return {k: v for k, v in found.items() if not names or k in names}


def plan_rows(rows: list[dict], card: dict, files: dict, measure: bool, seq_len: int | None = None) -> list[dict]:
    """The planner's answer for every row on every card (no GPU, no torch unless ``measure``: then the data's token
    lengths are measured first, as ``trainpilot-cli run`` does, so the data-following rows plan on their data)."""
    from trainer.supervisor import preflight

    out = []
    for i, r in enumerate(rows):
        cfg = config_of(r, files)
        if measure:
            if cfg.training.objective == "grpo":
                preflight.check_grpo(cfg)
            preflight.measure_data_lengths(cfg)
        for stem, (path, snap) in card.items():
            if (stem not in r["cards"]) if r["cards"] else stem.endswith("-apps-closed"):
                continue  # a row limited to its cards; the derived cards only for the rows that name them
            seq = seq_len or (longest(cfg, snap).tokens if r["longest"] else cfg.data.seq_len)
            plan = plan_run(config_mod.replace(cfg, **{"data.seq_len": seq}), snap)
            t = plan.resolved.training
            out.append({"row": i, "name": r["name"], "card": stem, "hardware": str(path), "verdict": plan.verdict,
                        "reference": list(r.get("reference", ())), "fused": bool(t.optimizer_in_backward),
                        "seq_len": seq, "tiled_mlp": plan.resolved.speed.tiled_mlp,
                        "planned_bytes": plan.predicted_peak_bytes, "budget_bytes": plan.budget_bytes,
                        "free_bytes": snap.gpus[0].memory_free_bytes,
                        "settings": {"micro": t.micro_batch_size, "accumulation": t.gradient_accumulation_steps,
                                     "checkpointing": plan.resolved.speed.gradient_checkpointing,
                                     "offload": plan.resolved.speed.activation_offload,
                                     "optimizer": t.optimizer, "deepspeed": plan.resolved.deepspeed.enabled},
                        "planned_length": next((x for x in plan.reasons if x.startswith("memory is planned at")), "")})
    return out


def bare_context_bytes() -> int:
    """This machine's bare CUDA context (bytes): NVML's device-used rise at a child's first allocation minus what
    torch reserved (the GPU otherwise idle)."""
    code = ("import torch; from trainer.hardware.source import open_probe; p = open_probe(); "
            "a = p.sample().gpus[0].memory_used_bytes; torch.zeros(1, device='cuda'); torch.cuda.synchronize(); "
            "b = p.sample().gpus[0].memory_used_bytes; print(b - a - torch.cuda.memory_reserved())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    return int(out.stdout.strip().splitlines()[-1])


class DeviceUse:
    """NVML's used memory of GPU 0, polled every 0.1 s in a thread: the peak rise over ``baseline`` (bytes)."""

    def __init__(self):
        self.probe = open_probe()
        self.baseline = self.probe.sample().gpus[0].memory_used_bytes
        self.peak = self.baseline
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self):
        while not self.stop.wait(0.1):
            self.peak = max(self.peak, self.probe.sample().gpus[0].memory_used_bytes)

    def rise(self) -> int:
        self.stop.set()
        self.thread.join()
        self.probe.close()
        return int(self.peak - self.baseline)


def run_one(entry: dict, cfg, work: Path, site: Path, context: int, timeout: int = ROW_TIMEOUT_S) -> dict:
    """``trainpilot-cli run`` of one row under one card's cap (at the sequence length it was planned at); what it
    used, how fast, its out-of-memory events."""
    cfg = config_mod.replace(cfg, **{"data.seq_len": entry["seq_len"]})
    run_dir = work / f"{entry['name']}-{entry['card']}"
    path = work / f"{entry['name']}.yaml"
    path.write_text(config_mod.dump_yaml(cfg), encoding="utf-8")
    env = dict(os.environ, **{CAP_ENV: str(entry["free_bytes"] - context),
                              "PYTHONPATH": os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")])})
    use, t0 = DeviceUse(), time.perf_counter()
    try:
        proc = subprocess.run(entrypoints.python_m(entrypoints.CLI, "run", path, "--run-dir", run_dir, "--hardware",
                                                   entry["hardware"], "--quiet", "--overwrite"),
                              capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
        code, tail = proc.returncode, proc.stderr[-1500:]
    except subprocess.TimeoutExpired:
        code, tail = None, "timed out"
        _kill_run(run_dir)
    used = use.rise()
    return {**entry, **_events(run_dir), "used_bytes": used, "exit_code": code, "seconds": time.perf_counter() - t0,
            "error_pct": 100.0 * (entry["planned_bytes"] - used) / used if used else None,
            "over_free": used > entry["free_bytes"], "stderr_tail": tail if code else ""}


def _kill_run(run_dir: Path) -> None:
    """Kill what a timed-out run left (the worker runs in a session of its own, so it outlives its supervisor and
    would hold the GPU through the next row)."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        if any(str(run_dir) in part for part in proc.info["cmdline"] or []):
            try:
                proc.kill()
            except psutil.Error:
                pass
    time.sleep(2)


def _events(run_dir: Path) -> dict:
    """tokens/s (median of the steps after the first two), torch's peak reserve and the out-of-memory events."""
    from trainer.rundir.events import read_events

    evs = read_events(run_dir / "events.jsonl") if (run_dir / "events.jsonl").exists() else []
    steps = [e for e in evs if e.get("type") == "step"]
    rates = [e["tokens_per_second"] for e in (steps[2:] or steps[-1:]) if e.get("tokens_per_second")]
    reserved = [e.get("gpu_memory_reserved_bytes") or 0 for e in steps]
    return {"steps": len(steps), "tokens_per_second": statistics.median(rates) if rates else None,
            "peak_reserved_bytes": max(reserved, default=0), "ooms": sum(e.get("type") == "oom" for e in evs)}


def _settings(r: dict) -> str:
    st = r["settings"]
    return (f"micro {st['micro']} × {st['accumulation']}" + (" ckpt" if st["checkpointing"] else "") +
            (" tiled" if r.get("tiled_mlp") else "") + (f" seq {r['seq_len']:,}" if r.get("seq_len", 2048) != 2048 else "") +
            (" offload" if st["offload"] else "") + (f" {st['optimizer']}" if st["optimizer"] != DEFAULT else "") +
            (" fused step" if r.get("fused") else "") +
            (" DeepSpeed" if st["deepspeed"] else ""))


def print_planned(r: dict) -> None:
    """A dry row: the plan only."""
    print(f"{r['row']:>2} {r['name']:<12} {r['card']:<21} {r['verdict']:<12} planned {r['planned_bytes'] / GIB:6.2f} GiB "
          f"of {r['budget_bytes'] / GIB:5.2f}  {_settings(r)}"
          + (f"  [{scaled_reference(r, None)}]" if r.get("reference") else ""), flush=True)


def markdown(rows: list[dict]) -> str:
    """The docs table: planned figures, and the measured columns (or "not measured: no GPU lent")."""
    out = ["| # | row | card | planner | settings | planned GiB | used GiB | error | tokens/s | out of memory |",
           "|---|---|---|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        used = r.get("used_bytes")
        measured = ("not measured: no GPU lent", "", "", "") if used is None else (
            f"{used / GIB:.2f}", f"{r['error_pct']:+.1f}%", f"{r['tokens_per_second'] or 0:,.0f}",
            "yes" if r.get("ooms") or r.get("over_free") else "no")
        out.append(f"| {r['row']} | {r['name']} | {r['card']} | {r['verdict'].replace('_', ' ')} | {_settings(r)} | "
                   f"{r['planned_bytes'] / GIB:.2f} | " + " | ".join(measured) + " |")
    return "\n".join(out)


def scaled_reference(r: dict, gpu_name: str | None) -> str:
    """A row's published tokens/s scaled to the measuring card by the two cards' bf16 peaks ("" without one)."""
    from trainer.planning.speed import peak_flops

    if not r.get("reference"):
        return ""
    who, rate, card = r["reference"]
    here, there = peak_flops(gpu_name), peak_flops(card)
    scaled = f" = {rate * here / there:,.0f} on this {gpu_name}" if here and there else ""
    return f"{who}: {rate:,.0f} tok/s on an {card}{scaled} (scaled by bf16 peaks)"


def print_row(r: dict) -> None:
    used = r.get("used_bytes")
    err, tps = r.get("error_pct"), r.get("tokens_per_second")
    flag = " OOM" * bool(r.get("ooms")) + (" OVER-FREE" if r.get("over_free") else "")
    print(f"{r['row']:>2} {r['name']:<12} {r['card']:<21} {r['verdict']:<12} planned {r['planned_bytes'] / GIB:6.2f} GiB"
          f"  used {'     -' if used is None else f'{used / GIB:6.2f}'} GiB  err {'-' if err is None else f'{err:+.1f}%':>7}"
          f"  {'-' if tps is None else f'{tps:,.0f}':>8} tok/s  micro {r['settings']['micro']}"
          f"{' ckpt' if r['settings']['checkpointing'] else ''}{' offload' if r['settings']['offload'] else ''}{flag}"
          + (f"  [{r['reference_words']}]" if r.get("reference_words") else ""), flush=True)


def summarize(rows: list[dict]) -> int:
    """The targets: every row within 10% of device-used memory, no out-of-memory among "fits"; exit 1 if missed."""
    ran = [r for r in rows if r.get("error_pct") is not None]
    fits_oom = [r for r in rows if r["verdict"] == "fits" and (r.get("ooms") or r.get("over_free"))]
    worst = max((abs(r["error_pct"]) for r in ran), default=float("nan"))
    print(f"rows run {len(ran)}/{len(rows)}; largest |error| {worst:.1f}% (target 10%); out of memory (or over the "
          f"card's free memory) among 'fits': {len(fits_oom)} (target 0)")
    return 0 if ran and worst <= 10 and not fits_oom else 1


def _with_steps(r: dict, steps: int) -> dict:
    """The row with at most ``steps`` optimizer steps."""
    out = json.loads(json.dumps(r))
    out["config"]["training"]["max_steps"] = min(steps, out["config"]["training"]["max_steps"])
    return out


def parse_only(text):
    """'0-3,7' → {0, 1, 2, 3, 7}; None → None (all rows)."""
    if not text:
        return None
    out = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out |= set(range(int(lo), int(hi or lo) + 1))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="planned vs device-used memory through trainpilot-cli run")
    ap.add_argument("--dry", action="store_true", help="plan every row for every card and print the planned column")
    ap.add_argument("--measure-data", action="store_true", help="--dry: measure the data's token lengths first")
    ap.add_argument("--list", action="store_true", help="print the numbered rows and the cards")
    ap.add_argument("--markdown", action="store_true", help="also print the docs table (docs/benchmarks.md)")
    ap.add_argument("--only", help="rows to run, e.g. 0-3,7")
    ap.add_argument("--cards", nargs="*", help="recordings to emulate (file stems; default: every one with a GPU)")
    ap.add_argument("--work", help="folder for data, configs and run directories (default: a temporary one)")
    ap.add_argument("--out", help="JSON results file")
    ap.add_argument("--seq-len", type=int, help="plan and run the chosen rows at this data.seq_len instead of their "
                    "own (or the longest they fit): a shorter run of a long-context row in a short GPU slot")
    ap.add_argument("--row-timeout", type=int, default=ROW_TIMEOUT_S, help="seconds a run may take before it is "
                    f"stopped (default {ROW_TIMEOUT_S})")
    ap.add_argument("--steps", type=int, help=f"optimizer steps per run (default {STEPS}; at least 3 for a tokens/s "
                    "median): fewer steps fit a short GPU slot, the peak is reached in the first ones")
    args = ap.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="gpu-truth-"))
    only, card = parse_only(args.only), cards(args.cards, work)
    rows = [r for i, r in enumerate(ROWS) if only is None or i in only]
    if args.steps:
        rows = [_with_steps(r, args.steps) for r in rows]
    if args.list:
        print("\n".join(f"{i:>2} {r['name']}" + (f"  (cards: {', '.join(r['cards'])})" if r["cards"] else "")
                        for i, r in enumerate(ROWS)) + "\ncards: " + ", ".join(card))
        return 0
    files = write_data(work / "data")
    planned = plan_rows(rows, card, files, args.measure_data or not args.dry, args.seq_len)
    for entry in planned:
        entry["row"] = next(i for i, r in enumerate(ROWS) if r["name"] == entry["name"])
    if args.dry:
        for entry in planned:
            print_planned(entry)
        if args.markdown:
            print(markdown(planned))
        _write(args.out, "dry", planned)
        return 0
    if not open_probe().snapshot().gpus:
        print("gpu_truth: no NVIDIA GPU on this machine; nothing to measure (use --dry for the planned column)")
        return 0
    return _measure(planned, rows, files, work, args.out, args.markdown, args.row_timeout)


def _measure(planned: list[dict], rows: list[dict], files: dict, work: Path, out: str | None,
             markdown_too: bool = False, row_timeout: int = ROW_TIMEOUT_S) -> int:
    site = work / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    context = bare_context_bytes()
    print(f"bare CUDA context here: {context / GIB:.2f} GiB; each card's cap = its recorded free memory minus this",
          flush=True)
    done, gpu = [], open_probe().snapshot().gpus[0].name
    for entry in planned:
        r = next(x for x in rows if x["name"] == entry["name"])
        done.append(run_one(entry, config_of(r, files), work, site, context, row_timeout))
        done[-1]["reference_words"] = scaled_reference(done[-1], gpu)
        print_row(done[-1])
        _write(out, "gpu", done, context)  # after every row: a call cut short still leaves its table
    if markdown_too:
        print(markdown(done))
    return summarize(done)


def _write(out: str | None, mode: str, rows: list[dict], context: int | None = None) -> None:
    if not out:
        return
    import platform

    meta = {"mode": mode, "time": time.time(), "machine": platform.node(), "bare_context_bytes": context}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str), encoding="utf-8")


if __name__ == "__main__":
    raise SystemExit(main())
