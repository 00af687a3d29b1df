"""Which GPUs a run trains on, as the wizard's card picker shows them (plain Python, no Qt; docs/gpus.md).

Every card of the planning snapshot is a row: its usable memory (``budget.usable_vram``: total − driver-reserved −
what other programs hold, the planner's own figure) and the programs that hold it. The planner's choice is what a
plan made with ``distributed.gpus: auto`` trained on (plan.json's ``gpus``); the user's is a list of UUIDs written
into ``distributed.gpus`` (UUIDs are stable across reboots; indices are not always). The words never call a card the
user picked the best when the planner's choice has more usable memory.
"""
from __future__ import annotations

from dataclasses import dataclass

from app.model.fmt import gib
from trainer.hardware.gpu_processes import is_desktop_process
from trainer.planning import gpus as planning_gpus
from trainer.planning.budget import budget_for, classify

HOLDER_MIN_BYTES = 64 * 2**20  # a program holding less is not named (a compositor's tiny context), as the planner


@dataclass(frozen=True)
class CardRow:
    """One card of the machine: NVML ``index``, ``uuid`` (None where NVML gave none), ``name``, memory in bytes
    (``total``, ``usable``, ``held`` by other programs, ``budget`` the planner plans against), the programs holding
    it ((name, bytes) each) and whether it drives the display."""

    index: int
    uuid: str | None
    name: str
    total: int
    usable: int
    held: int
    budget: int
    holders: tuple = ()
    display: bool = False

    @property
    def key(self):
        """What ``distributed.gpus`` records for this card: its UUID, its index where NVML gave none."""
        return self.uuid or self.index

    @property
    def title(self) -> str:
        """"GPU 1 · NVIDIA GeForce RTX 3090 — 23.6 GiB usable of 24.0 GiB"."""
        return f"GPU {self.index} · {self.name} — {gib(self.usable)} usable of {gib(self.total)}"

    def holders_words(self) -> str:
        """What holds this card's memory: "1.2 GiB held by Xorg 0.40 GiB, firefox 0.64 GiB (it drives the
        display)", or "nothing else holds it"."""
        if not self.holders:
            return f"{gib(self.held)} in use, no program named" if self.held >= HOLDER_MIN_BYTES else \
                "nothing else holds it"
        names = ", ".join(f"{n} {gib(b, 2)}" for n, b in self.holders)
        return f"{gib(self.held)} held by {names}" + (" (it drives the display)" if self.display else "")


def card_rows(snapshot, goal: str = "fastest") -> list[CardRow]:
    """The rows of ``snapshot``'s cards (a ``MachineSnapshot``), in NVML order; [] without a GPU."""
    rows = []
    for g in getattr(snapshot, "gpus", None) or ():
        budget, usable, held = budget_for(g, goal)
        holders = tuple((p.name, p.used_memory_bytes) for p in g.processes
                        if (p.used_memory_bytes or 0) >= HOLDER_MIN_BYTES)
        display = any(is_desktop_process(n) for n, _ in holders)
        rows.append(CardRow(g.index, g.uuid, g.name, g.memory_total_bytes or 0, usable, held, budget, holders,
                            display))
    return rows


def best_keys(snapshot, goal: str = "fastest") -> list:
    """The planner's choice of one card before any plan has answered: the card with the most budget, first in
    ``trainer.planning.gpus.ranked`` (the planner's own order). A plan left to choose may take several cards where
    they are estimated faster (``planner_keys`` then says so)."""
    order = planning_gpus.ranked(snapshot, goal) if getattr(snapshot, "gpus", None) else []
    return [order[0].uuid or order[0].index] if order else []


def planner_keys(plan) -> list | None:
    """The cards a plan made with ``distributed.gpus: auto`` trains on (plan.json's ``gpus``, by UUID); None for a
    plan of the user's own cards (it says nothing of the planner's choice) or no plan."""
    if plan is None:
        return None
    cfg = getattr(plan, "config_in", None)
    if cfg is not None and cfg.distributed.gpus != "auto":
        return None
    return [e.get("uuid") or e.get("index") for e in getattr(plan, "gpus", None) or []]


def chosen(value) -> list | None:
    """The user's cards from ``distributed.gpus`` (a list), None for 'auto' (the planner's)."""
    return list(value) if isinstance(value, list) else None


def row_of(rows: list[CardRow], key) -> CardRow | None:
    """The row ``key`` (a UUID or an index, as ``distributed.gpus`` lists them) names."""
    return next((r for r in rows if (r.uuid == key if isinstance(key, str) else r.index == key)), None)


def toggled(rows: list[CardRow], ticked: list, key, on: bool) -> list | None:
    """The cards ticked after the user (un)ticks ``key``: UUIDs in NVML order (rank i trains on the i-th). None when
    it would untick the last card (a run trains on at least one; "Use the planner's choice" returns to auto)."""
    keep = {row_of(rows, k).key for k in ticked if row_of(rows, k) is not None}
    row = row_of(rows, key)
    if row is None:
        return list(keep) or None
    keep = keep | {row.key} if on else keep - {row.key}
    if not keep:
        return None
    return [r.key for r in rows if r.key in keep]


def set_words(rows: list[CardRow]) -> str:
    """"GPU 1 (NVIDIA GeForce RTX 3090)", or "GPUs 0 + 1"."""
    if len(rows) == 1:
        return f"GPU {rows[0].index} ({rows[0].name})"
    return "GPUs " + " + ".join(str(r.index) for r in rows)


def choice_words(rows: list[CardRow], ticked: list, planner: list, mine: bool, plan=None) -> str:
    """Why these cards are ticked, in one paragraph of plain text: the planner's choice and why (most usable memory,
    or the set estimated faster), or the user's — and where the user's is smaller than the planner's, that it is
    (never that it is the best)."""
    if len(rows) < 2:
        return "This machine's one GPU trains the run." if rows else "No NVIDIA GPU: the run trains on the CPU."
    cards = [r for r in (row_of(rows, k) for k in ticked) if r is not None]
    theirs = [r for r in (row_of(rows, k) for k in planner) if r is not None]
    if not cards:
        return ""
    if not mine or {r.key for r in cards} == {r.key for r in theirs}:
        head = "The planner's choice" if not mine else "Your choice is the planner's"
        return f"{head}: {set_words(cards)} — {_why_planner(rows, cards, plan)}"
    return f"Your choice: {set_words(cards)}. {_against_planner(cards, theirs)}"


def _why_planner(rows: list[CardRow], cards: list[CardRow], plan) -> str:
    if len(cards) == 1:
        c = cards[0]
        others = "; ".join(f"GPU {r.index} has {gib(r.usable)}" + (" (it drives the display)" if r.display else "")
                           for r in rows if r is not c)
        return f"the card with the most usable memory ({gib(c.usable)}); {others}."
    kept = next((r for r in (getattr(plan, "reasons", None) or []) if r.startswith("card sets planned")), "")
    why = kept.rsplit(" — ", 1)[-1] if " — " in kept else "several cards planned"
    return f"{len(cards)} cards: {why}."


def _against_planner(cards: list[CardRow], theirs: list[CardRow]) -> str:
    """The user's cards beside the planner's: less memory per rank, more, or the same; what binds uneven cards."""
    if not theirs:
        return "The plan below is made for these cards."
    mine_budget, their_budget = min(r.budget for r in cards), min(r.budget for r in theirs)
    planner = f"the planner's choice ({set_words(theirs)}, {gib(their_budget)} budget per card)"
    if mine_budget < their_budget:
        small = min(cards, key=lambda r: r.budget)
        out = (f"Each rank gets {gib(mine_budget)} to plan against: less than {planner}"
               + (f" — the {small.name} (GPU {small.index}) binds every rank" if len(cards) > 1 else "") + ".")
    elif mine_budget > their_budget:
        out = f"Each rank gets {gib(mine_budget)} to plan against, more than {planner}."
    else:
        out = f"Each rank gets the same {gib(mine_budget)} as {planner}."
    return out + " The plan below is made for your cards; \"Use the planner's choice\" returns to it."


def preset_words(snapshot, keys: list, goal: str = "fastest", split: bool = False) -> str:
    """The preset a plan on the cards ``keys`` starts from, and the card it follows: the one that binds the ranks
    (the smallest budget of the cards used, ``CardSet.binding``), classified as the planner classifies it
    (``budget.classify``) — never GPU 0 of the machine unless it is that card ("" without a GPU). ``split``: the
    plan splits the model's layers over the cards (each card its own share: none binds the others)."""
    gpus = [g for g in getattr(snapshot, "gpus", None) or () if g.uuid in keys or g.index in keys]
    if not gpus:
        return ""
    binding = planning_gpus.CardSet(tuple(gpus), goal).binding
    preset = classify(binding)[2]
    which = "the card the run uses" if len(gpus) == 1 else \
        "the smallest of the cards the layers are split over" if split else \
        "the smallest of the cards the run uses: it binds every rank"
    return f"Preset: {preset} — the starting point for GPU {binding.index} ({binding.name}), {which}"

