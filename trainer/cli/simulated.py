"""``plan --simulate``: the plan's step run on fake tensors in a child process (``python -m
trainer.worker.probes.simulate``), printed beside the plan's components. Light: the child imports torch, this does not.
"""
from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from trainer import config as config_mod
from trainer.core import entrypoints
from trainer.core.errors import EXIT_BAD_INPUT, UserError
from trainer.core.units import GIB
from trainer.planning.saver_memory import HOST_NOT_SIMULATED, NOT_SIMULATED


def run_simulation(plan, layers: int = 4, timeout: float = 1800) -> dict:
    """Simulate ``plan.resolved`` in a child process (``layers``: at most this many decoder layers, scaled to the
    model's depth; 0: every layer). The child's JSON; UserError with its one line when it cannot simulate."""
    with tempfile.TemporaryDirectory(prefix="trainpilot-simulate-") as tmp:
        cfg_path, out = Path(tmp) / "config.yaml", Path(tmp) / "simulated.json"
        cfg_path.write_text(config_mod.dump_yaml(plan.resolved), encoding="utf-8")
        argv = [str(cfg_path), "--out", str(out), "--layers", str(layers)]
        if plan.breakdown.get("attention_mask"):
            argv.append("--packed")
        proc = subprocess.run(entrypoints.python_m(entrypoints.SIMULATE, *argv), capture_output=True, text=True,
                              timeout=timeout)
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        if proc.returncode == EXIT_BAD_INPUT:
            raise UserError(tail)
        if proc.returncode != 0 or not out.exists():
            raise UserError(f"the simulated step failed: {tail}")
        return json.loads(out.read_text(encoding="utf-8"))


def compared(plan, sim: dict) -> dict:
    """The simulation beside the plan (bytes): ``planned_bytes`` (the components a simulation holds), the
    simulated peak, ``error_pct`` (planned − simulated, of simulated), and the host side likewise. The components
    left out are the plan's margins of ``saver_memory.NOT_SIMULATED`` (``not_simulated``, with ``margin_reasons``)."""
    est = getattr(getattr(plan, "choice", None), "estimate", None)
    split = len(est.cards) if est is not None and est.cards else 0
    # the layers split over cards: the child runs the whole model on one device, so it is held to the one-card sum
    # the split apportions (planning/layer_split), not to one card's share
    breakdown = est.unsplit if split else plan.breakdown
    covered = {k: v for k, v in breakdown.items() if k not in NOT_SIMULATED}
    host = {k: v for k, v in plan.host_breakdown.items() if k not in HOST_NOT_SIMULATED}
    planned, peak = sum(covered.values()), sim["peak_bytes"]
    return {"planned_bytes": planned, "simulated_bytes": peak,
            "error_pct": round(100.0 * (planned - peak) / peak, 1) if peak else None,
            "planned_host_bytes": sum(host.values()), "simulated_host_bytes": sim["host_peak_bytes"],
            "not_simulated": {k: v for k, v in breakdown.items() if k in NOT_SIMULATED},
            "margin_reasons": {k: NOT_SIMULATED[k] for k in breakdown if k in NOT_SIMULATED}, "split_cards": split,
            **sim}


def format_simulation(c: dict) -> str:
    """The comparison as text, for ``plan --simulate``."""
    def g(n):
        return f"{n / GIB:.2f} GiB"

    layers = c["layers"]
    how = (f"{layers} layers: {c['simulated_layers'][0]} and {c['simulated_layers'][1]} simulated, the per-layer "
           f"part scaled" if c.get("simulated_layers") else f"all {layers} layers")
    lines = [f"simulated step (fake tensors, two optimizer steps, {how}; {c['seconds']:.0f} s):",
             f"  GPU peak         {g(c['simulated_bytes'])}   planned {g(c['planned_bytes'])} for the same components "
             f"({c['error_pct']:+.1f}%)" + (f" — the whole model on one device: the plan's one-card sum, which it "
                                            f"splits over {c['split_cards']} cards" if c.get("split_cards") else ""),
             "  live at the peak: " + ", ".join(f"{k} {g(v)}" for k, v in sorted(c["at_peak"].items(),
                                                                            key=lambda kv: -kv[1]) if v >= 2**20),
             f"  host RAM peak    {g(c['simulated_host_bytes'])}   planned {g(c['planned_host_bytes'])}"
             + ("  (" + ", ".join(f"{k} {g(v)}" for k, v in c["host_at_peak"].items() if v >= 2**20) + ")"
                if c["host_at_peak"] else ""),
             *([f"  paged states' working set {g(c['paged_working_set_bytes'])} (the most one parameter's update "
                f"brought in; CUDA managed memory beside the allocator's reserve, so a margin: planned "
                f"{g(c['not_simulated'].get('paged_states_working_set', 0))})"]
               if c.get("paged_working_set_bytes") else []),
             "  not simulated (the plan's margins): " + (", ".join(f"{k} {g(v)}" for k, v in c["not_simulated"].items())
                                                         or "none")]
    lines += [f"    {k}: {why}" for k, why in c.get("margin_reasons", {}).items()]
    return "\n".join(lines)
