"""The longest sequence a run fits: ``trainpilot-cli plan CONFIG --max-seq`` and the wizard's Method page. No torch.

The planner is asked at the lengths of ``planning.lengths`` (k × ``step`` tokens by bisection, halvings of ``step``
below it; the config's other values as given, everything it leaves ``auto`` chosen by the planner for that length,
as a run would get it): a longer sequence never needs less memory. The search stops at the model's positions
(``max_position_embeddings``). Where other programs hold VRAM in the snapshot (a browser), the search runs again as
if the ones worth closing were closed (``budget.close_apps``): "49,152 tokens; 53,248 with firefox closed"; and for
packed supervised data, once more with one document per sequence (``data.packing: false``), whose attention needs
no mask (``planning.packed_mask``).
Tokens are counted per sequence; bytes are bytes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from trainer import config as config_mod
from trainer.hardware.probe import MachineSnapshot
from trainer.models.positions import run_position_limit
from trainer.planning.budget import close_apps
from trainer.planning.lengths import STEP, longest_fitting, next_up, shortest
from trainer.planning.plan import Plan, plan_run

UNKNOWN_LIMIT = 1 << 20  # tokens: where the search stops for a model whose positions are not known


@dataclass
class Longest:
    """The longest fitting sequence on one snapshot: ``tokens`` (0 when not even the grid's shortest fits), the
    ``step`` of the grid (``planning.lengths``), the model's ``limit`` (positions; None when unknown) and whether the search
    stopped there (``at_limit``), and the plan at that length (None when nothing fits)."""

    tokens: int
    step: int
    limit: Optional[int]
    at_limit: bool
    plan: Optional[Plan] = field(default=None, repr=False)
    limited_by: str = ""  # what the next step up runs out of: "positions" (the model's), "VRAM" or "host RAM"
    tight: int = 0  # the next length up where its plan is 'tight' (within the margin, as the verdict says), else 0

    def to_dict(self) -> dict:
        """JSON-ready: the length, the step and limit, and the plan's peak, budget and chosen settings there."""
        p = self.plan
        return {"longest_seq_len": self.tokens, "step": self.step, "limit": self.limit, "at_limit": self.at_limit,
                "limited_by": self.limited_by, "tight_seq_len": self.tight or None,
                "predicted_peak_bytes": p.predicted_peak_bytes if p else None,
                "budget_bytes": p.budget_bytes if p else None,
                "host_ram_needed_bytes": p.host_ram_needed_bytes if p else None,
                "settings": dict(p.settings) if p else {}}


@dataclass
class LongestContext:
    """The longest sequence as the snapshot is (``here``) and, where programs worth closing hold VRAM, with them
    closed (``closed``; ``apps`` lists them as ``budget.close_apps`` does)."""

    here: Longest
    apps: list = field(default_factory=list)
    closed: Optional[Longest] = None
    unpacked: Optional[Longest] = None  # packed SFT: the same with one document per sequence (no attention mask)

    def words(self) -> str:
        """"49,152 tokens; 53,248 with firefox closed" (multiples of the step), with what stops it where that is
        not VRAM: "(the model's limit)", "(host RAM is the limit)"."""
        text = _tokens_words(self.here)
        if self.closed is not None and self.closed.tokens != self.here.tokens:
            names = ", ".join(dict.fromkeys(a["name"] for a in self.apps))
            text += f"; {self.closed.tokens:,} with {names} closed{_limit_words(self.closed, ' there')}"
        if self.unpacked is not None and self.unpacked.tokens > self.here.tokens:
            text += (f"; {self.unpacked.tokens:,} with one document per sequence (data.packing: false: no attention "
                     f"mask){_limit_words(self.unpacked, ' there')}")
        return text

    def to_dict(self) -> dict:
        out = self.here.to_dict()
        out["with_apps_closed"] = None
        if self.closed is not None:
            out["with_apps_closed"] = {**self.closed.to_dict(), "apps": self.apps}
        out["unpacked"] = self.unpacked.to_dict() if self.unpacked is not None else None
        return out


def _tokens_words(found: Longest) -> str:
    text = f"{found.tokens:,} tokens" if found.tokens else f"not even {shortest(found.step):,} tokens fit"
    if not found.tight:
        return text + _limit_words(found)
    more = "; with more host RAM it would fit" if found.limited_by == "host RAM" else ""
    return text + f"; {found.tight:,} is tight (within the plan's margin{more})"


def _limit_words(found: Longest, where: str = "") -> str:
    """What stops the search where it is not VRAM, in words ("" for VRAM)."""
    if found.at_limit:
        return f" (the model's limit{where})"
    return f" (host RAM is the limit{where})" if found.limited_by == "host RAM" else ""


def model_limit(cfg) -> Optional[int]:
    """The most positions the config's model reads (``max_position_embeddings``, tokens), None when unknown (no
    config.json here yet): where this search stops and what the wizard refuses a longer ``data.seq_len`` by."""
    return run_position_limit(cfg)  # the one reader, also Start's and the export's (trainer.models.positions)


def longest(cfg, hardware: MachineSnapshot, step: int = STEP, goal: Optional[str] = None) -> Longest:
    """The longest length on the planner's grid (``planning.lengths``: multiples of ``step``, halvings below it) whose
    plan fits ``hardware`` (see the module docstring)."""
    limit = model_limit(cfg)

    def fits(tokens: int) -> Optional[Plan]:
        plan = _plan_at(cfg, hardware, tokens, goal)
        return plan if plan.verdict == "fits" else None

    tokens, best = longest_fitting(fits, limit or UNKNOWN_LIMIT, step)
    at_limit = bool(limit) and tokens > 0 and next_up(tokens, step) > limit
    # the next length on the grid, which does not fit: where nothing fits, the grid's shortest (what "not even 256
    # tokens fit" names, and what it runs out of), not one step
    over = next_up(tokens, step) if tokens else shortest(step)
    tight = 0
    if not at_limit and (not limit or over <= limit):
        tight = over if _plan_at(cfg, hardware, over, goal).verdict == "tight" else 0
    return Longest(tokens, step, limit, at_limit, best,
                   "positions" if at_limit else _short_of(cfg, hardware, over, goal), tight)


def _short_of(cfg, hardware: MachineSnapshot, tokens: int, goal: Optional[str]) -> str:
    """What ``tokens`` runs out of: "host RAM" where the plan would fit with as much host RAM as it asks for (the
    offloaded checkpoints live there), else "VRAM" (on the CPU, host RAM)."""
    if not hardware.gpus:
        return "host RAM"
    roomy = dataclasses.replace(hardware, host=dataclasses.replace(hardware.host, ram_available_bytes=1 << 50))
    return "host RAM" if _plan_at(cfg, roomy, tokens, goal).verdict == "fits" else "VRAM"


def _plan_at(cfg, hardware: MachineSnapshot, tokens: int, goal: Optional[str]) -> Plan:
    return plan_run(config_mod.replace(cfg, **{"data.seq_len": tokens}), hardware, goal=goal, alternatives=False)


def without_apps(hardware: MachineSnapshot, apps: list[dict]) -> MachineSnapshot:
    """``hardware`` as if the programs in ``apps`` (``budget.close_apps`` rows of GPU 0) were closed: their processes
    gone, their memory free."""
    gpu = hardware.gpus[0]
    pids = {a["pid"] for a in apps}
    freed = sum(a["used_memory_bytes"] or 0 for a in apps)
    used = None if gpu.memory_used_bytes is None else max(0, gpu.memory_used_bytes - freed)
    free = None if gpu.memory_free_bytes is None else gpu.memory_free_bytes + freed
    first = dataclasses.replace(gpu, processes=tuple(p for p in gpu.processes if p.pid not in pids),
                                memory_used_bytes=used, memory_free_bytes=free)
    return dataclasses.replace(hardware, gpus=(first, *hardware.gpus[1:]))


def longest_context(cfg, hardware: MachineSnapshot, step: int = STEP, goal: Optional[str] = None) -> LongestContext:
    """The longest fitting sequence here and, where programs worth closing hold VRAM, with them closed."""
    here = longest(cfg, hardware, step, goal)
    gpu = hardware.gpus[0] if hardware.gpus else None
    apps = [a for a in close_apps(gpu) if a["used_memory_bytes"]] if gpu is not None and cfg.device != "cpu" else []
    closed = longest(cfg, without_apps(hardware, apps), step, goal) if apps and not here.at_limit else None
    unpacked = None
    if _masked_by_packing(cfg) and not here.at_limit:
        unpacked = longest(config_mod.replace(cfg, **{"data.packing": False}), hardware, step, goal)
    return LongestContext(here, apps, closed, unpacked)


def _masked_by_packing(cfg) -> bool:
    """Packed supervised blocks whose attention needs a mask (``planning.packed_mask``; FlashAttention-2 needs none)."""
    return cfg.training.objective == "sft" and cfg.data.packing and cfg.model.attn_implementation != "flash_attention_2"
