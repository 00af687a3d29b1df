"""The layers of one model split over several cards in one process (``distributed.layer_split``, docs/gpus.md):
which share of a plan's memory each card holds, how many decoder layers each card gets, and which card binds.
Bytes. No torch.

transformers places a model over several cards with a ``device_map`` (accelerate's hooks move each layer's input to
its card): card 0 holds the embeddings and the first layers, the next cards the next layers, the last card the final
norm, the LM head and the loss — a model with tied embeddings keeps its head beside them on card 0, so the shared
weight lives once. One card computes at a time (a naive pipeline: no card works while another does), so a split
gains no compute over one card; it is the way to train adapters on a model no single card holds (Unsloth's answer to
2× RTX 3060: ``device_map="balanced"``; here each card's share is planned against its own budget), and the planner
plans it only where neither one card nor the cards as data-parallel ranks fit (``plan._plan_card_sets``).

Each component of the whole model's estimate (``memory.estimate`` of one card holding everything, the same setup)
goes to the card that holds it:

- **per layer** (``PER_LAYER``): the layers' weights (the whole model's weights less the embeddings and the head), the
  adapters with their gradients and AdamW states, the saved activations (or checkpointed layer inputs), the mask's
  per-layer part: each card holds its layers' share (the layers' average: uniform models are exact);
- **every card** (``EVERY_CARD``): what each card has once — the CUDA context and kernel modules of the process on it,
  one layer's recompute in backward and the gradients through it, the MLP tile, QLoRA's dequantised Linear, and the
  shared attention mask (the hooks copy it to each card);
- **the head's card** (``HEAD_CARD``): the LM head's input and the loss (or DPO's reference logits);
- the allocator's **fragmentation**: its share of what churns on that card.

A component not named here is counted on every card (the safe side). The layers are given out so that each card
keeps about the same room (``counts``); ``distributed.layers_per_gpu`` sets them yourself.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

PER_LAYER = ("weights", "adapter_states", "activations", "attention_mask")
EVERY_CARD = ("cuda_context", "cuda_kernels", "recompute", "mlp_tile", "dequant_buffer", "layer_backward")
HEAD_CARD = ("logits_loss", "reference_forward")


@dataclass(frozen=True)
class Parts:
    """What the split apportions, from the whole model's estimate: its components, the bytes of the weights that are
    not the layers' (embeddings on the first card, an untied head on the head's card), the activations the head
    keeps, the attention mask's shared part, and the allocator's share of churning bytes (``churns``: the components
    that churn, ``memory.CHURN``: the one-card estimate's rule, applied to each card's own)."""
    breakdown: dict
    embedding_bytes: int
    head_bytes: int
    head_activations: int
    shared_mask: int
    fragmentation_share: float
    churns: tuple = ()


@dataclass(frozen=True)
class Card:
    """One card's share: its layers [first, first + layers), its components and peak, its budget."""
    position: int  # the card's place in distributed.gpus (0: the first card, holding the embeddings)
    first: int
    layers: int
    breakdown: dict
    peak_bytes: int
    budget_bytes: int
    holds_head: bool

    def to_dict(self) -> dict:
        return {"position": self.position, "first_layer": self.first, "layers": self.layers,
                "peak_bytes": self.peak_bytes, "budget_bytes": self.budget_bytes, "holds_head": self.holds_head,
                "breakdown": dict(self.breakdown)}


def unavailable(cfg, spec) -> Optional[str]:
    """Why this run's layers cannot be split over cards ("" never; None: they can): adapters on a decoder-only text
    model, on one machine, without DeepSpeed, not GRPO (its sampling phase is not planned split)."""
    if cfg.method.type not in ("lora", "qlora"):
        return "a full fine-tune updates every layer's optimizer states: its cards are data-parallel ranks (ZeRO)"
    if cfg.training.objective == "grpo":
        return "GRPO's sampling phase is not planned with the layers split"
    if cfg.distributed.num_nodes > 1:
        return "the layers are split over one machine's cards (one process)"
    if cfg.deepspeed.enabled is True:
        return "DeepSpeed's engine owns the model's placement"
    if spec is not None and (spec.encoder_decoder or spec.vision is not None or spec.frozen_params):
        return "only decoder-only text models are planned split (an encoder-decoder or a vision tower is not)"
    return None


def head_first(spec) -> bool:
    """The LM head sits on the first card: tied embeddings (one weight, kept where the embeddings are)."""
    return bool(spec.tied_embeddings) or not spec.lm_head_params


def _holds_head(position: int, cards: int, tied: bool) -> bool:
    """Card ``position`` of ``cards`` holds the LM head and the loss: the last, or the first for a tied head."""
    return position == (0 if tied else cards - 1)


def _fixed(parts: Parts, position: int, cards: int, tied: bool) -> dict:
    """The components a card holds whatever its layers: every card's, the embeddings (first), the head and loss."""
    out = {k: parts.breakdown.get(k, 0) for k in EVERY_CARD}
    out.update({k: v for k, v in parts.breakdown.items() if k not in PER_LAYER + EVERY_CARD + HEAD_CARD +
                ("fragmentation",)})  # not apportioned: on every card (the safe side)
    holds_head = _holds_head(position, cards, tied)
    weights = (parts.embedding_bytes if position == 0 else 0) + (parts.head_bytes if holds_head else 0)
    out["weights"] = weights
    out["activations"] = parts.head_activations if holds_head else 0
    out["attention_mask"] = parts.shared_mask
    for k in HEAD_CARD:
        out[k] = parts.breakdown.get(k, 0) if holds_head else 0
    return out


def _per_layer(parts: Parts, n: int) -> dict:
    """One decoder layer's bytes of each per-layer component (the layers' average)."""
    b = parts.breakdown
    return {"weights": max(0, b.get("weights", 0) - parts.embedding_bytes - parts.head_bytes) / n,
            "adapter_states": b.get("adapter_states", 0) / n,
            "activations": max(0, b.get("activations", 0) - parts.head_activations) / n,
            "attention_mask": max(0, b.get("attention_mask", 0) - parts.shared_mask) / n}


def card_share(parts: Parts, n: int, position: int, cards: int, first: int, layers: int, tied: bool,
               budget: int) -> Card:
    """Card ``position``'s components with ``layers`` of the model's ``n`` decoder layers."""
    breakdown = _components(parts, _fixed(parts, position, cards, tied), _per_layer(parts, n), layers)
    return Card(position, first, layers, breakdown, int(sum(breakdown.values())), budget,
                _holds_head(position, cards, tied))


def _components(parts: Parts, fixed: dict, per: dict, layers: int) -> dict:
    """A card's components: what it holds whatever its layers, ``layers`` × each per-layer part, and fragmentation."""
    breakdown = {k: int(fixed.get(k, 0) + layers * per.get(k, 0)) for k in dict.fromkeys([*fixed, *per])}
    breakdown["fragmentation"] = int(parts.fragmentation_share * sum(breakdown.get(k, 0) for k in parts.churns))
    return {k: v for k, v in breakdown.items() if v}


def counts(parts: Parts, n: int, budgets: tuple, tied: bool) -> list[int]:
    """Decoder layers per card, in order, so that each card keeps about the same room: every card one layer, then
    each further layer to the card with the most room left after it (the first such card on a tie). Each card's
    fixed part and the per-layer part are made once (the search estimates many setups)."""
    k = len(budgets)
    if n < k:
        return [1] * n + [0] * (k - n)
    fixed, per = [_fixed(parts, i, k, tied) for i in range(k)], _per_layer(parts, n)
    out = [1] * k
    for _ in range(n - k):
        rooms = [budgets[i] - sum(_components(parts, fixed[i], per, out[i] + 1).values()) for i in range(k)]
        out[rooms.index(max(rooms))] += 1
    return out


def split(parts: Parts, n: int, budgets: tuple, tied: bool, layers: Optional[tuple] = None) -> list[Card]:
    """Each card's share: ``layers`` per card (``distributed.layers_per_gpu``), else ``counts``'s."""
    per = list(layers) if layers else counts(parts, n, budgets, tied)
    out, first = [], 0
    for i, (count, budget) in enumerate(zip(per, budgets)):
        out.append(card_share(parts, n, i, len(budgets), first, count, tied, budget))
        first += count
    return out


def fullest(cards) -> dict:
    """Of a split's cards (``Card.to_dict``: an Estimate's ``cards``, a plan's), the one with the least room (the
    smaller budget, then the first, on a tie): the estimate's breakdown and the plan's headline are its."""
    return min(cards, key=lambda c: (c["budget_bytes"] - c["peak_bytes"], c["budget_bytes"], c["position"]))


def layer_range(card: dict) -> str:
    """'layers 0–21' of a card's entry (``Card.to_dict``)."""
    first, n = card.get("first_layer", 0), card.get("layers", 0)
    return f"layer {first}" if n == 1 else f"layers {first}–{first + n - 1}"


def holds_words(card: dict, first: bool, last: bool) -> str:
    """What a card holds beyond its layers, in words (``first``, ``last``: its place among the cards)."""
    extra = (["the embeddings"] if first else []) + \
        (["the final norm"] if last else []) + (["the LM head and the loss"] if card.get("holds_head") else [])
    if not extra:
        return layer_range(card)
    return layer_range(card) + ", " + (" and ".join(extra) if len(extra) < 3 else ", ".join(extra[:-1]) + " and " +
                                       extra[-1])
