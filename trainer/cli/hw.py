"""``probe``, ``plan`` and ``doctor`` subcommands (registered by trainer.cli.main). No torch here."""
from __future__ import annotations

import json
import sys

from trainer import config as config_mod
from trainer.core.errors import EXIT_BAD_INPUT, UserError
from trainer.core.units import GIB
from trainer.cli import simulated
from trainer.data import token_stats
from trainer.data.scan import scan
from trainer.hardware.recording import record
from trainer.hardware.source import open_probe, planning_snapshot
from trainer.planning.longest import STEP, longest_context
from trainer.planning.step_probe import measure_plan
from trainer.planning.plan import plan_run
from trainer.planning.verdict import method_verdict
from trainer.supervisor import preflight
from trainer.supervisor.doctor import run_doctor


def register(sub) -> None:
    """Add the hardware commands to ``trainpilot-cli``."""
    p = sub.add_parser("probe", help="show the GPUs, what uses them, and the host (or record them)")
    p.add_argument("--json", action="store_true", help="print one JSON snapshot")
    p.add_argument("--record", metavar="FILE", help="write snapshots to a JSONL recording")
    p.add_argument("--seconds", type=float, default=10.0, help="how long to record (seconds)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between recorded snapshots")
    p.add_argument("--hardware", metavar="FILE", help="show a recording instead of this machine")
    p.set_defaults(func=cmd_probe)

    p = sub.add_parser("plan", help="choose settings that fit this GPU and explain why")
    p.add_argument("config", help="run config YAML")
    p.add_argument("--hardware", metavar="FILE", help="plan for a recording (JSONL) instead of this machine")
    p.add_argument("--json", action="store_true", help="print plan.json")
    p.add_argument("--measure", action="store_true", help="run 2-3 real steps on the GPU and correct the micro-batch")
    p.add_argument("--simulate", action="store_true",
                   help="run the plan's training step on fake tensors (no GPU needed) and print its peak beside the plan")
    p.add_argument("--simulate-layers", type=int, default=4, metavar="N",
                   help="--simulate builds at most N decoder layers and scales the per-layer part (0: every layer)")
    p.add_argument("--goal", choices=["fastest", "most_headroom"], help="override plan_goal")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value")
    p.add_argument("--max-seq", action="store_true",
                   help="print the longest data.seq_len that fits with the settings the planner would choose (and "
                        "with the programs holding VRAM closed)")
    p.add_argument("--seq-step", type=int, default=STEP, metavar="TOKENS",
                   help=f"--max-seq tries multiples of this many tokens (default {STEP})")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("doctor", help="check Python, torch/CUDA, DeepSpeed, disk and RAM, with fixes")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.add_argument("--output-dir", default="runs", help="where runs will be written (free disk is checked there)")
    p.set_defaults(func=cmd_doctor)


def _gb(n) -> str:
    return "-" if n is None else f"{n / GIB:.1f} GiB"


def _val(v, unit="") -> str:
    return "-" if v is None else f"{v:g}{unit}" if isinstance(v, (int, float)) else str(v)


def format_snapshot(snap) -> str:
    """A plain-text table of a MachineSnapshot."""
    lines = []
    if not snap.gpus:
        lines.append(snap.note or "no NVIDIA GPU")
    for g in snap.gpus:
        kind = "laptop" if g.is_laptop else "desktop/server"
        lines.append(f"GPU {g.index}: {g.name} ({kind}, compute capability {_val(g.compute_capability)}, "
                     f"driver {_val(g.driver_version)}, CUDA {_val(g.cuda_driver_version)})")
        lines.append(f"  memory   {_gb(g.memory_used_bytes)} used of {_gb(g.memory_total_bytes)}, "
                     f"{_gb(g.memory_free_bytes)} free")
        lines.append(f"  load     {_val(g.utilization_pct, '%')} · {_val(g.temperature_c, ' °C')} · "
                     f"{_val(g.power_w, ' W')} of {_val(g.power_limit_w, ' W')} · SM {_val(g.sm_clock_mhz)}/"
                     f"{_val(g.sm_clock_max_mhz)} MHz · fan {_val(g.fan_pct, '%')}")
        if g.throttle_reasons:
            lines.append(f"  clocks held down by: {', '.join(g.throttle_reasons)}")
        for p in g.processes:
            mem = "memory not reported" if p.used_memory_bytes is None else _gb(p.used_memory_bytes)
            lines.append(f"  process  {p.pid:>7}  {p.name:<24} {p.type:<16} {mem}")
    h = snap.host
    lines.append(f"host: {_gb(h.ram_available_bytes)} of {_gb(h.ram_total_bytes)} RAM available, {h.cpu_count} CPUs")
    return "\n".join(lines)


def cmd_probe(args) -> int:

    if args.seconds <= 0 or args.interval <= 0:
        raise UserError("--seconds and --interval must be positive")
    probe = open_probe(args.hardware)
    try:
        if args.record:
            n = record(probe, args.record, args.seconds, args.interval)
            print(f"wrote {n} snapshots to {args.record}")
            return 0
        snap = probe.snapshot()
    finally:
        probe.close()
    print(json.dumps(snap.to_dict(), indent=2) if args.json else format_snapshot(snap))
    return 0


def format_plan(plan, verdict=None) -> str:
    """The plan as text: verdict (``verdict``: the plan's MethodVerdict, so 'needs bitsandbytes' reads as the
    wizard shows it), chosen settings, breakdown, reasons, what to close, alternatives."""
    d = plan.to_dict()
    words = verdict.words if verdict is not None else d["verdict"].replace("_", " ")
    lines = [f"verdict: {words}  (preset {d['preset']}, {d['form_factor']}"
             f"{'' if d['tier'] is None else ', ' + str(d['tier']) + ' GB tier'})"]
    if verdict is not None and verdict.verdict == "needs":
        lines += [f"  needs: {m}" for m in verdict.reasons[:len(verdict.needs)]]
    lines.append(f"predicted peak {_gb(d['predicted_peak_bytes'])} of budget {_gb(d['budget_bytes'])}; "
                 f"host RAM needed {_gb(d['host_ram_needed_bytes'])}")
    if d["settings"]:
        lines.append("settings:")
        lines += [f"  {k} = {json.dumps(v)}" for k, v in d["settings"].items()]
    if d.get("preset_values"):
        lines.append(f"preset {d['preset']} (machine settings under your config):")
        for v in d["preset_values"]:
            shown = {"changed": f"{json.dumps(v['preset'])} -> {json.dumps(v['planned'])}",
                     "yours": f"{json.dumps(v['planned'])} (preset: {json.dumps(v['preset'])})"}.get(
                v["status"], json.dumps(v["preset"]))
            lines.append(f"  {v['status']:<8} {v['key']} = {shown}" + (f"  ({v['why']})" if v["why"] else ""))
    if d["breakdown"]:
        lines.append("memory by component:")
        lines += [f"  {k:<18} {_gb(v)}" for k, v in sorted(d["breakdown"].items(), key=lambda kv: -kv[1])]
    lines += _phase_lines(d.get("phases") or {})
    lines.append("why:")
    lines += [f"  - {r}" for r in d["reasons"]]
    if d["close_apps"]:
        lines.append("using VRAM now: " + ", ".join(f"{a['name']} ({_gb(a['used_memory_bytes'])})" for a in d["close_apps"]))
    for a in d["alternatives"]:
        needs = a.get("needs") or []
        mark = "fits" if a["fits"] else ("fits, but needs " + " and ".join(needs) if needs and
                                         a["predicted_peak_bytes"] <= d["budget_bytes"] else "does not fit")
        lines.append(f"alternative ({mark}, peak {_gb(a['predicted_peak_bytes'])}): {a['description']}")
        lines.append("    --set " + " --set ".join(f"{k}={json.dumps(v)}" for k, v in a["settings"].items()))
    lines += [f"note: {n}" for n in d["notes"]]
    return "\n".join(lines)


def _phase_lines(phases: dict) -> list[str]:
    """GRPO's two phases, each with its peak and components; the larger one is the plan's peak."""
    if not phases:
        return []
    top = max(phases, key=lambda k: phases[k]["peak_bytes"])
    lines = ["GRPO phases (sampling: generate + reference scoring; update: forward/backward of one micro-batch):"]
    for name, ph in phases.items():
        lines.append(f"  {name:<8} peak {_gb(ph['peak_bytes'])}" + ("  <- the plan's peak" if name == top else ""))
        lines += [f"    {k:<24} {_gb(v)}" for k, v in sorted(ph["breakdown"].items(), key=lambda kv: -kv[1])]
    return lines


def cmd_plan(args) -> int:

    cfg = config_mod.load(args.config, args.set)
    snap = planning_snapshot(args.hardware)
    if args.max_seq:  # the card's longest sequence, asked before the data is there: not this data's lengths
        return _max_seq(args, cfg, snap)
    _measure_data(cfg)
    plan = plan_run(cfg, snap, goal=args.goal)
    verdict = method_verdict(plan, snap)  # what the wizard shows: 'needs bitsandbytes' as well as fits
    report = None
    if args.measure:

        if plan.device != "cuda" or not snap.gpus:
            print("trainpilot-cli: measuring needs an NVIDIA GPU (plan --measure runs real training steps on it); "
                  "this machine has none, so only the prediction is available", file=sys.stderr)
            return EXIT_BAD_INPUT
        report = measure_plan(plan, snap)
    sim = None
    if args.simulate:
        sim = simulated.compared(plan, simulated.run_simulation(plan, max(0, args.simulate_layers)))
    if args.json:
        d = dict(plan.to_dict(), method_verdict=verdict.to_dict())
        if report is not None:
            d["measured"] = report
        if sim is not None:
            d["simulated"] = sim
        print(json.dumps(d, indent=2))
    else:
        print(format_plan(plan, verdict))
        if sim is not None:
            print(simulated.format_simulation(sim))
    return 0


def _measure_data(cfg) -> None:
    """What ``run`` measures before it plans, measured here too (``preflight.measure_data_lengths``: a DPO, KTO, ORPO,
    unpacked or picture run's token lengths, with the run's tokenizer), so the plan printed is the plan that runs.
    Stored by the data's fingerprint (``token_stats``): the second of plan and run reuses it. Data that is not there
    yet is planned at data.seq_len (run refuses it, naming the file). A supervised file is checked first, as run
    checks it (``scan``, cached): whether it holds pictures decides whether its lengths count."""
    if token_stats.key(cfg) is None:
        return
    if cfg.training.objective == "sft" and not cfg.data.hub_dataset:
        scan(cfg.data.path, cfg.data)
    preflight.measure_data_lengths(cfg, announce=lambda: print(
        "measuring the data's token lengths with the run's tokenizer, as run does (once for this data: the result is "
        "kept for the next plan or run)…", file=sys.stderr, flush=True))


def _max_seq(args, cfg, snap) -> int:
    """``plan --max-seq``: the longest sequence that fits, in words (or ``--json``), with the settings there."""
    if args.measure:
        raise UserError("--max-seq and --measure go separately: find the length first, then measure its plan with "
                        "--set data.seq_len=N --measure")
    if args.seq_step < 1:
        raise UserError(f"--seq-step {args.seq_step}: use a positive number of tokens (e.g. 1024)")
    found = longest_context(cfg, snap, args.seq_step, args.goal)
    if args.json:
        print(json.dumps(found.to_dict(), indent=2))
        return 0
    print(f"longest context (data.seq_len in multiples of {args.seq_step:,} tokens): {found.words()}")
    for label, one in (("here", found.here), ("closed", found.closed)):
        if one is None or one.plan is None or (label == "closed" and one.tokens == found.here.tokens):
            continue
        p = one.plan
        head = f"at {one.tokens:,} tokens" + (" with those programs closed" if label == "closed" else "")
        lines = [f"{head}: predicted peak {_gb(p.predicted_peak_bytes)} of budget {_gb(p.budget_bytes)}; host RAM "
                 f"needed {_gb(p.host_ram_needed_bytes)}"]
        lines += [f"  {k} = {json.dumps(v)}" for k, v in p.settings.items()]
        print("\n".join(lines))
    return 0


def cmd_doctor(args) -> int:

    checks = run_doctor(args.output_dir)
    if args.json:
        print(json.dumps(checks, indent=2))
    else:
        for c in checks:
            mark = "ok " if c["ok"] else ("FAIL" if c["required"] else "warn")
            print(f"[{mark}] {c['name']}: {c['detail']}")
            if c["fix"]:
                print(f"       fix: {c['fix']}")
    return 0 if all(c["ok"] for c in checks if c["required"]) else 1
