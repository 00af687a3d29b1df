"""Which GPUs a run trains on, and how a set of several is judged (docs/gpus.md). Bytes, seconds. No torch.

One card: the one with the most usable memory (its budget: ``budget.budget_for``), not GPU 0 — on a desktop whose
GPU 0 is a small card driving the display, GPU 0 is the wrong card. ``distributed.gpus`` picks cards by NVML index
or UUID instead; ``distributed.num_gpus`` asks for that many (the best ones). Left to the planner on a machine with
several cards (neither key set), the planner plans one card, the best two, the best three… and keeps the set with the
best verdict and, among those that fit, the shortest predicted optimizer step — a set of several only where it is
estimated at least ``MORE_CARDS_MIN_GAIN`` faster than one card (or one card does not fit, which it says).

Several cards are data-parallel ranks (DDP, or DeepSpeed ZeRO-2/3 where one card cannot hold the model states: the
search's levels). Every rank holds the same share (ZeRO shards evenly), so the card with the smallest budget binds
every rank; the plan says so and compares with the set without it. The step time of a set is the plan's one time
model (``speed.optimizer_step``) on the slowest card: its micro-batches, the host's step where DeepSpeed offloads the
optimizer, and the exchange between the cards over the slowest card's link (``speed.exchange_bytes``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from trainer.config.loading import explicit_keys
from trainer.core.errors import UserError
from trainer.core.units import gib
from trainer.hardware.gpu_processes import is_desktop_process
from trainer.hardware.probe import GpuSnapshot, MachineSnapshot
from trainer.planning import layer_split
from trainer.planning.budget import budget_for
from trainer.planning.context import make_setup
from trainer.planning.speed import PCIE_EFFICIENCY, optimizer_step, peak_flops

MORE_CARDS_MIN_GAIN = 0.10  # a set of several is chosen over one card only when estimated this much faster
UNEVEN_SHARE = 0.95  # cards whose budgets differ by more than this ratio are "uneven": the smallest binds


@dataclass(frozen=True)
class CardSet:
    """The cards of one candidate plan, in CUDA_VISIBLE_DEVICES order (rank i trains on ``cards[i]``)."""

    cards: tuple[GpuSnapshot, ...]
    goal: str = "fastest"
    split: bool = False  # the model's layers split over the cards in one process (planning/layer_split), not ranks

    @property
    def binding(self) -> Optional[GpuSnapshot]:
        """The card every rank is planned against: the smallest budget of the set (None: no card)."""
        return min(self.cards, key=lambda g: (budget_for(g, self.goal)[0], g.index)) if self.cards else None

    @property
    def ids(self) -> list:
        """What ``distributed.gpus`` records: each card's UUID (stable across reboots), its index where NVML gave
        none."""
        return [g.uuid or g.index for g in self.cards]

    @property
    def uneven(self) -> bool:
        budgets = [budget_for(g, self.goal)[0] for g in self.cards]
        return len(budgets) > 1 and min(budgets) < UNEVEN_SHARE * max(budgets)

    def without(self, gpu: GpuSnapshot) -> "CardSet":
        rest = tuple(g for g in self.cards if g is not gpu)
        return CardSet(rest, self.goal, self.split and len(rest) > 1)

    def words(self) -> str:
        """"GPU 1 (NVIDIA GeForce RTX 3090)", "GPUs 0 + 1 (2× NVIDIA GeForce RTX 3090)", or with the layers split
        "GPUs 0 + 1 + 2 (3× NVIDIA GeForce RTX 5060 Ti), the layers split over them"."""
        if len(self.cards) == 1:
            return card_words(self.cards[0])
        names = [g.name for g in self.cards]
        kinds = ", ".join(n if names.count(n) == 1 else f"{names.count(n)}× {n}" for n in dict.fromkeys(names))
        return f"GPUs {' + '.join(str(g.index) for g in self.cards)} ({kinds})" + \
            (", the layers split over them" if self.split else "")


def card_words(g: GpuSnapshot) -> str:
    return f"GPU {g.index} ({g.name})"


def ranked(hardware: MachineSnapshot, goal: str) -> list[GpuSnapshot]:
    """The machine's cards, most budget first (the lower index on a tie)."""
    return sorted(hardware.gpus, key=lambda g: (-budget_for(g, goal)[0], g.index))


def named(cfg, hardware: MachineSnapshot) -> Optional[tuple[GpuSnapshot, ...]]:
    """The cards ``distributed.gpus`` lists, in its order (None: 'auto'). UserError naming the key for a card this
    machine does not have."""
    wanted = cfg.distributed.gpus
    if not isinstance(wanted, list):
        return None
    problem = missing(cfg, hardware)
    if problem:
        raise UserError(f"distributed.gpus: {problem}", field="distributed.gpus")
    return tuple(hardware.card(w) for w in wanted)


def missing(cfg, hardware: Optional[MachineSnapshot]) -> str:
    """What is wrong with ``distributed.gpus`` on this machine, with the fix ("" when nothing): a card it lacks."""
    wanted = cfg.distributed.gpus
    if not isinstance(wanted, list) or hardware is None:
        return ""
    absent = [w for w in wanted if hardware.card(w) is None]
    if not absent:
        return ""
    return (f"this machine has no GPU {absent[0]!r} ({_inventory(hardware)}); list indices or UUIDs from that list "
            "(trainpilot-cli probe shows them), or set distributed.gpus: auto")


def _inventory(hardware: MachineSnapshot) -> str:
    if not hardware.gpus:
        return "it has no NVIDIA GPU"
    return "its GPUs: " + "; ".join(f"{g.index} = {g.name} {g.uuid or ''}".rstrip() for g in hardware.gpus)


def candidates(cfg, hardware: MachineSnapshot, goal: str) -> list[CardSet]:
    """The card sets to plan, the first being the one to plan when there is no choice. UserError for cards the
    machine lacks, or more cards than it has."""
    listed = named(cfg, hardware)
    if listed is not None:
        if not listed and cfg.device == "cuda":
            raise UserError("distributed.gpus: [] names no GPU but device is cuda; list the cards to train on, or "
                            "set distributed.gpus: auto", field="distributed.gpus")
        return [CardSet(listed, goal)]
    order = ranked(hardware, goal)
    n = cfg.distributed.num_gpus
    if not order:
        return [CardSet((), goal)]
    if n > len(order) and cfg.device != "cpu":
        raise UserError(f"distributed.num_gpus: {n} GPUs per machine asked, but this machine has {len(order)} "
                        f"({_inventory(hardware)}); set distributed.num_gpus: {len(order)} or fewer",
                        field="distributed.num_gpus")
    if n > 1 or "distributed.num_gpus" in explicit_keys(cfg) or cfg.distributed.num_nodes > 1 or len(order) == 1:
        return _with_splits(cfg, [CardSet(tuple(sorted(order[:n], key=lambda g: g.index)), goal)])
    return _with_splits(cfg, [CardSet(tuple(sorted(order[:k], key=lambda g: g.index)), goal)
                              for k in range(1, len(order) + 1)])


def _with_splits(cfg, sets: list[CardSet]) -> list[CardSet]:
    """``sets`` with the layers split over each set of several cards where ``distributed.layer_split`` is true
    ('auto' splits a set only where its ranks do not fit: ``split_variant``)."""
    if cfg.distributed.layer_split is not True:
        return sets
    return [CardSet(c.cards, c.goal, len(c.cards) > 1) for c in sets]


def split_variant(cfg, cards: CardSet) -> Optional[CardSet]:
    """The same cards with the model's layers split over them, for a set of several planned as ranks under
    ``distributed.layer_split: auto`` where a split can run (``layer_split.unavailable``); None otherwise."""
    if cfg.distributed.layer_split != "auto" or len(cards.cards) < 2 or cards.split or \
            layer_split.unavailable(cfg, None) is not None:
        return None
    return CardSet(cards.cards, cards.goal, True)


def why_this_card(cards: CardSet, hardware: MachineSnapshot) -> str:
    """Why a plan of one card on a machine of several uses this one ("" on a one-GPU machine)."""
    if len(hardware.gpus) < 2 or len(cards.cards) != 1:
        return ""
    g = cards.cards[0]
    others = [o for o in hardware.gpus if o is not g]
    return (f"{card_words(g)} of this machine's {len(hardware.gpus)}: the card with the most usable memory "
            f"({gib(budget_for(g, cards.goal)[1])}); " + "; ".join(_card_state(o, cards.goal) for o in others)
            + " (distributed.gpus picks another card, distributed.num_gpus several)")


def _card_state(g: GpuSnapshot, goal: str) -> str:
    usable, held = budget_for(g, goal)[1:]
    holders = [p.name for p in g.processes if (p.used_memory_bytes or 0) >= 64 * 2**20]
    display = any(is_desktop_process(p.name) and (p.used_memory_bytes or 0) >= 64 * 2**20 for p in g.processes)
    what = f", {gib(held)} held by {', '.join(holders)}" if holders else ""
    return f"{card_words(g)} has {gib(usable)} usable{what}" + (" (it drives the display)" if display else "")


# -- time: the one time model on the slowest card, with the exchange between the cards -----------------------------
def link_bytes_per_second(cards: CardSet) -> Optional[float]:
    """The link the exchange between the cards runs over (bytes/s, its signalling rate): the slowest card's PCIe link
    (``speed.optimizer_step`` runs copies at ``PCIE_EFFICIENCY`` of it). GeForce cards have no peer-to-peer: NCCL
    routes a ring through host memory, each card's traffic over its own link. NVLink bridges are not modelled. None
    when a link is not reported."""
    links = [g.pcie_bytes_per_second for g in cards.cards]
    if not links or any(v is None for v in links):
        return None
    return min(links)


def step_time(plan, cards: CardSet) -> Optional[dict]:
    """The predicted optimizer step of ``plan`` (made for ``cards``): ``speed.optimizer_step`` on the slowest card
    (every rank waits for it) with the exchange over the set's slowest link — ``micro_batches`` (compute and the
    copies beside it), ``host`` and ``host_copies`` (the host's step where DeepSpeed offloads the optimizer),
    ``exchange`` and ``total`` seconds, ``bytes`` exchanged. None where a card's peak or a link is unknown, or the
    plan has no memory prediction."""
    ctx, choice = plan.ctx, plan.choice
    if ctx is None or choice is None or ctx.spec is None or not cards.cards:
        return None
    peaks = [peak_flops(g.name) for g in cards.cards]
    if any(p is None for p in peaks):
        return None
    slowest = cards.cards[peaks.index(min(peaks))]
    setup = make_setup(ctx, choice.micro, choice.ckpt, choice.ds, choice.offload, choice.optimizer)
    if cards.split:
        return _split_step_time(ctx, plan, cards, setup)
    return optimizer_step(ctx.spec, setup, choice.estimate, slowest.name, slowest.pcie_bytes_per_second,
                          link_bytes_per_second(cards) if len(cards.cards) > 1 else None) or None


def _split_step_time(ctx, plan, cards: CardSet, setup) -> Optional[dict]:
    """The step of a model whose layers are split over ``cards``: one card computes at a time, each its share of
    the layers (``speed.optimizer_step`` of the whole model's micro-batches on that card × its share of the layers),
    and between neighbours the hidden states cross over PCIe (forward) and their gradients back (backward): 16-bit,
    micro-batch × sequence × hidden bytes per crossing, through host memory (GeForce cards have no peer-to-peer), so
    each crossing is timed over the slower link twice. None where a card's peak or link is unknown."""
    shares = [e.get("layers", 0) / max(1, ctx.spec.layers) for e in plan.gpus]
    if len(shares) != len(cards.cards):
        return None
    steps = [optimizer_step(ctx.spec, setup, plan.choice.estimate, g.name, g.pcie_bytes_per_second) for g in cards.cards]
    if not all(steps):
        return None
    compute = sum(share * one["micro_batches"] for share, one in zip(shares, steps))
    tokens = setup.micro_batch * setup.sequences_per_sample * setup.seq_len
    n = max(1, setup.gradient_accumulation)
    moved = int(n * (len(cards.cards) - 1) * 2 * tokens * ctx.spec.hidden * setup.activation_width)
    link = link_bytes_per_second(cards)
    if moved and not link:
        return None
    exchange = 2 * moved / (link * PCIE_EFFICIENCY) if moved else 0.0
    host, host_copies = steps[0]["host"], steps[0]["host_copies"]
    return {"compute": compute, "micro_batches": compute, "host": host, "host_copies": host_copies,
            "exchange": exchange, "total": compute + host + host_copies + exchange, "bytes": moved}


VERDICT_RANK = {"fits": 0, "tight": 1, "does_not_fit": 2, "unknown": 3}


def best(options: list) -> int:
    """Index of the plan to keep among ``options`` [(CardSet, plan, step_time or None)], one card first: the best
    verdict; among fitting ones the shortest step, several cards only when ``MORE_CARDS_MIN_GAIN`` faster than
    the fewest-card fitting set (unknown times: the fewest cards)."""
    top = min(VERDICT_RANK[p.verdict] for _, p, _ in options)
    tied = [i for i, (_, p, _) in enumerate(options) if VERDICT_RANK[p.verdict] == top]
    keep = tied[0]
    for i in tied[1:]:
        t_keep, t_i = options[keep][2], options[i][2]
        if t_keep and t_i and t_i["total"] < (1.0 - MORE_CARDS_MIN_GAIN) * t_keep["total"]:
            keep = i
    return keep


def seconds(t: Optional[dict]) -> str:
    if not t:
        return "time unknown (a card's compute peak or PCIe link is not known)"
    moved = gib(t["bytes"]) if t["bytes"] >= 2**30 else f"{t['bytes'] / 2**20:.0f} MiB"
    host = t["host"] + t["host_copies"]
    on_host = (f" + {host:.2f} s for the optimizer step on the host" if t["host"] else
               f" + {host:.2f} s paging the optimizer states over PCIe" if host else "")
    ex = f" + {t['exchange']:.2f} s exchanging {moved} over PCIe" if t["exchange"] else ""
    return f"≈ {t['total']:.2f} s per optimizer step ({t['micro_batches']:.2f} s compute{on_host}{ex})"


def comparison(options: list, kept: int) -> str:
    """The sets planned and why the kept one: each set's verdict, per-rank peak and step time, and which card binds
    a set of uneven cards."""
    parts = []
    for i, (cards, plan, t) in enumerate(options):
        binds = f" (the {cards.binding.name} binds every rank)" if cards.uneven and not cards.split else ""
        mark = " <- planned" if i == kept else ""
        per = "on its fullest card" if cards.split else "per card"
        parts.append(f"{cards.words()}: {plan.verdict.replace('_', ' ')}, {gib(plan.predicted_peak_bytes)} {per} "
                     f"of {gib(plan.budget_bytes)}{binds}, {seconds(t)}{mark}")
    return "card sets planned: " + "; ".join(parts) + f" — {_why_kept(options, kept)}"


def _why_kept(options: list, kept: int) -> str:
    """Why ``gpus.best`` kept that set, in words: it fits where fewer cards do not, it is estimated faster, or more
    cards do not fit, are slower, or are too little faster."""
    cards, plan, t = options[kept]
    fewest = options[0]
    gain = int(MORE_CARDS_MIN_GAIN * 100)
    if len(cards.cards) > len(fewest[0].cards):
        if VERDICT_RANK[fewest[1].verdict] > VERDICT_RANK[plan.verdict]:
            return f"{fewest[0].words()} alone does not fit as well ({fewest[1].verdict.replace('_', ' ')})"
        return f"estimated at least {gain}% faster than fewer cards"
    more = [(c, p, t2) for c, p, t2 in options if len(c.cards) > len(cards.cards)]
    if not more:
        return "the only set that fits this machine's cards"
    out = []
    for c, p, t2 in more:
        if VERDICT_RANK[p.verdict] > VERDICT_RANK[plan.verdict]:
            out.append(f"{c.words()} does not fit as well")
        elif not t or not t2:
            out.append(f"{c.words()}: the step times cannot be compared, so fewer cards (no gradient exchange)")
        elif t2["total"] >= t["total"]:
            slow = f"the {c.binding.name} binds its memory and speed" if c.uneven else "the exchange over PCIe costs more"
            out.append(f"{c.words()} is estimated slower ({t2['total']:.2f} s against {t['total']:.2f} s: {slow})")
        else:
            out.append(f"{c.words()} is estimated only {int(100 * (1 - t2['total'] / t['total']))}% faster, "
                       f"below the {gain}% that takes more cards")
    return "; ".join(out)


def skipped(cards: CardSet, effective_batch: int) -> str:
    return (f"{cards.words()}: not planned, the effective batch {effective_batch} does not divide into "
            f"{len(cards.cards)} equal ranks")


def ranks_words(plan, cards: CardSet) -> str:
    """Each rank's share on its card, and which card binds them all (several cards only)."""
    if len(cards.cards) < 2:
        return ""
    if cards.split:
        return split_words(plan, cards)
    ds = (plan.choice.ds if plan.choice is not None else None) or (False, 0, False, False)
    how = f"DeepSpeed ZeRO-{ds[1]} shards {'weights, ' if ds[1] == 3 else ''}gradients and optimizer states over " \
        f"{len(cards.cards)} ranks" if ds[0] and not ds[2] else \
        f"{len(cards.cards)} data-parallel ranks (each card holds the whole model states)" if not ds[0] else \
        f"{len(cards.cards)} ranks with DeepSpeed's offload"
    per = ", ".join(f"{card_words(g)} {gib(plan.predicted_peak_bytes)} of its {gib(budget_for(g, cards.goal)[0])}"
                    for g in cards.cards)
    out = f"{how}: each rank's share is planned ({per})"
    if cards.uneven:
        b = cards.binding
        out += (f"; the {b.name} (GPU {b.index}) binds: every rank holds the same share, so each is planned against "
                f"its {gib(budget_for(b, cards.goal)[0])} budget and the larger cards' extra memory stays unused")
    return out


def split_words(plan, cards: CardSet) -> str:
    """The layers split over the cards in words: each card's layers, what else it holds, its peak and budget."""
    entries = plan.gpus
    per = "; ".join(f"{card_words(g)}: {layer_split.holds_words(e, i == 0, i == len(entries) - 1)}, "
                    f"{gib(e.get('rank_peak_bytes') or 0)} of its {gib(e.get('budget_bytes') or 0)}"
                    for i, (g, e) in enumerate(zip(cards.cards, entries)))
    return (f"the model's layers split over {len(cards.cards)} cards in one process (distributed.layer_split; "
            f"transformers' device_map, one card computing at a time; planned because neither one card nor the cards as "
            f"data-parallel ranks fit): {per}")


def left_out_words(cards: CardSet, plan, t: Optional[dict], without: CardSet, other, t_other: Optional[dict]) -> str:
    """The set against the same set without its binding card: memory and step time, and which is better."""
    b = cards.binding
    faster = t and t_other and t_other["total"] < t["total"]
    fits_better = VERDICT_RANK[other.verdict] < VERDICT_RANK[plan.verdict]
    verdict = ("leaving it out would be better" if faster and VERDICT_RANK[other.verdict] <= VERDICT_RANK[plan.verdict]
               or fits_better else "keeping it is better")
    return (f"without the {b.name} (GPU {b.index}), {without.words()}: {other.verdict.replace('_', ' ')}, "
            f"{gib(other.predicted_peak_bytes)} per card of {gib(other.budget_bytes)}, {seconds(t_other)}; with it: "
            f"{plan.verdict.replace('_', ' ')}, {gib(plan.predicted_peak_bytes)} of {gib(plan.budget_bytes)}, "
            f"{seconds(t)} — {verdict}")


# -- per card, for a plan's readers (the GUI's verdict and bar per card) ---------------------------------------------
def uneven_budgets(entries: list[dict]) -> bool:
    """True when the budgets of plan.json's ``gpus`` entries (bytes) differ by more than ``UNEVEN_SHARE``: the card
    with the smallest budget then binds every rank (the same test as ``CardSet.uneven``, on the written plan)."""
    budgets = [e.get("budget_bytes") or 0 for e in entries]
    return len(budgets) > 1 and min(budgets) < UNEVEN_SHARE * max(budgets)


def binding_entry(entries: list[dict]) -> Optional[dict]:
    """The entry of plan.json's ``gpus`` every rank is planned against: the smallest budget (the lower index on a
    tie), as ``CardSet.binding`` chose it. None without cards."""
    return min(entries, key=lambda e: (e.get("budget_bytes") or 0, e.get("index") or 0)) if entries else None


def card_verdict(entry: dict, entries: list[dict], verdict: str) -> str:
    """One card's line of a plan (bytes in plan.json's ``gpus`` entries): the rank's planned peak against this card's
    budget, and — where the cards are uneven — whether this card binds every rank or has memory left unused.
    ``verdict`` is the plan's ('fits', 'tight', 'does_not_fit'): every rank holds the same share, so a card that is
    not the binding one has at least the binding card's room."""
    peak, budget = entry.get("rank_peak_bytes"), entry.get("budget_bytes") or 0
    head = f"GPU {entry.get('index')} ({entry.get('name')}): {gib(peak or 0)} of its {gib(budget)} budget"
    if "layers" in entry:  # the layers split over the cards: each card its own share, judged against its own budget
        first, last = entry == entries[0], entry == entries[-1]
        fits_here = "fits" if (peak or 0) <= budget else "does not fit"
        return f"{head} ({layer_split.holds_words(entry, first, last)}), {fits_here}"
    if len(entries) < 2 or not uneven_budgets(entries):
        return f"{head}, {verdict.replace('_', ' ')}"
    if entry is binding_entry(entries) or entry == binding_entry(entries):
        return f"{head}, {verdict.replace('_', ' ')} — the smallest card: it binds every rank"
    unused = max(0, budget - (peak or 0))
    return f"{head} — {gib(unused)} of it stays unused (the smallest card binds every rank)"
