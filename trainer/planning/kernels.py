"""How the run computes its layers, decided in one place with the loss: the tiled MLP (``speed.tiled_mlp``) and the
adapters' dropout (``method.lora_dropout``). The loss kernel has its own home (``loss_kernel``); the search weighs
these beside it and the resolved config tells the worker, which installs exactly that. Light: no torch.

- **Tiled MLP**: each decoder layer's MLP runs over tiles of the sequence (ALST's ``TiledMLP``;
  ``trainer/worker/kernels``), so its intermediates — several times the hidden size per token — exist for one tile
  at a time; it keeps only its input for backward and runs its forward once more there. Exact.
- **LoRA dropout**: each adapter's dropout keeps its own copy of the adapter's input (and a mask) for backward; at
  0 the adapters keep the input itself (QLoRA: one copy per input tensor). Training differs (no dropout
  regularisation); 0.05 is the default elsewhere.

``auto`` for both: the search runs once per variant, cheapest first (``variants``: no tiling before tiling; dropout
0.05 before 0 at each), and keeps a later variant only where it does better by the search's own ranking
(``better``): it fits where the earlier does not, or fits with fewer memory savers (no activation offload, no
DeepSpeed), or with a larger micro-batch the plan's one time model estimates 10% faster — so a short sequence that
fits keeps 0.05 and no tiling. Explicit values are the only variant: judged, never changed. ``method.lora_experts`` (PEFT's
``ParamWrapper``) runs only without dropout: its ``auto`` is 0.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from trainer.core.units import LEAST_PRINTED
from trainer.planning.speed import OFFLOAD_MIN_GAIN

DROPOUT = 0.05  # the adapters' dropout where nothing needs 0 (PEFT's examples and the former default)


@dataclass(frozen=True)
class Variant:
    """One way to compute the layers: MLP tiled or not, the adapters' dropout."""

    tiled_mlp: bool
    lora_dropout: float


def dropout_default(cfg) -> float:
    """The dropout a config means before the planner weighs it: its value, or for ``auto`` 0 with
    ``method.lora_experts`` (PEFT's ``ParamWrapper`` needs 0) and ``DROPOUT`` otherwise."""
    d = cfg.method.lora_dropout
    if d != "auto":
        return float(d)
    return 0.0 if cfg.method.lora_experts and cfg.method.type != "full" else DROPOUT


def tiled_options(cfg, can_tile: bool) -> list[bool]:
    """``speed.tiled_mlp`` as set; ``auto``: off, then on where the planner can plan the model's MLP tiled."""
    v = cfg.speed.tiled_mlp
    if isinstance(v, bool):
        return [v]
    return [False, True] if can_tile else [False]


def dropout_options(cfg) -> list[float]:
    """``method.lora_dropout`` as set; ``auto`` with adapters: ``DROPOUT``, then 0."""
    first = dropout_default(cfg)
    if cfg.method.lora_dropout != "auto" or cfg.method.type == "full" or first == 0.0:
        return [first]
    return [first, 0.0]


def variants(cfg, can_tile: bool) -> list[Variant]:
    """The variants the search weighs, cheapest first: no tiling before tiling (an extra MLP forward per layer);
    at each, the default dropout before none (dropout 0 costs nothing in time)."""
    return [Variant(t, d) for t in tiled_options(cfg, can_tile) for d in dropout_options(cfg)]


def better(o, than) -> bool:
    """Whether outcome ``o`` (a later, costlier variant's) beats ``than`` by the search's own preferences: it fits
    where ``than`` does not (or, neither fitting, needs less by a printable amount, ``LEAST_PRINTED``: a variant
    that costs compute is not kept for a saving the plan would print as 0.0 GiB); it fits with fewer memory savers
    (its level: no activation offload, no DeepSpeed); or, checkpointing alike, with a larger micro-batch where
    ``than``'s is estimated ``OFFLOAD_MIN_GAIN`` slower per optimizer step by the plan's one time model (the
    outcomes' ``speed``: the larger micro-batch keeps the card busier, the variant's own compute — the tiled MLP's
    extra forward — counted), the rule checkpointing and activation offload are weighed by. Not to turn
    checkpointing off: dropout's regularisation and the recompute are not given up for that."""
    if o.fits != than.fits:
        return o.fits
    if not o.fits:  # the least memory, by a printable amount: a costlier variant is not kept for nothing
        return o.need <= than.need - LEAST_PRINTED
    if o.level != than.level:
        return o.level < than.level
    timed = o.busy is not None and than.busy is not None  # a card with a known peak: the GPU's utilisation applies
    return timed and o.ckpt == than.ckpt and o.micro > than.micro and o.speed * (1.0 - OFFLOAD_MIN_GAIN) > than.speed


def best_possible(o, largest_micro: int) -> bool:
    """Nothing a later variant can be ``better`` than: it fits without memory savers, at the largest micro-batch or
    keeping the card so busy that no larger micro-batch could be ``OFFLOAD_MIN_GAIN`` faster (the time model's
    utilisation: at most 1 / ``busy`` faster)."""
    return o.fits and o.level == 0 and (o.micro == largest_micro or o.busy is None or o.busy >= 1.0 - OFFLOAD_MIN_GAIN)


def choose(outcomes: list) -> int:
    """The index of the variant to run among ``outcomes`` (one per variant, cheapest first): the first that no later
    one is ``better`` than. Where nothing fits, a later variant must need less than every earlier one by a printable
    amount: each of its choices (tiling, dropout) saves memory on its own, as the plan's savings rows measure it."""
    best = 0
    for i in range(1, len(outcomes)):
        o = outcomes[i]
        if better(o, outcomes[best]) and (o.fits or all(better(o, e) for e in outcomes[:i])):
            best = i
    return best


def why(cfg, chosen: Variant, tried: dict, gib, budget: int, usable: Optional[int] = None) -> list[str]:
    """The plan's sentences for what the planner chose for ``auto`` (none where it kept the cheapest variant):
    ``tried`` maps each variant the search ran to its ``loss_kernel.Outcome``; each choice is set against the
    variant that differs from the chosen one in that choice alone. ``usable``: the budget with its margin (a need
    up to it is 'tight', as the verdict says, not 'does not fit')."""
    out, ours = [], tried[chosen]
    untiled = tried.get(Variant(False, chosen.lora_dropout))
    if chosen.tiled_mlp and cfg.speed.tiled_mlp == "auto" and untiled is not None:
        out.append(f"tiled MLP on (speed.tiled_mlp: auto): each layer's MLP and norms run over tiles of the sequence, "
                   f"keeping only their inputs for backward; without it the run {_outcome_words(untiled, gib, budget, usable)}, "
                   f"with it the run {_outcome_words(ours, gib, budget, usable)}")
    dropped = tried.get(Variant(chosen.tiled_mlp, DROPOUT))
    if chosen.lora_dropout == 0 and cfg.method.lora_dropout == "auto" and dropped is not None and dropped is not ours:
        out.append(f"LoRA dropout 0 (method.lora_dropout: auto): dropout keeps its own copy of every adapted input for "
                   f"backward; at {ours.tokens:,} tokens per micro-batch, with dropout {DROPOUT:g} the run "
                   f"{_outcome_words(dropped, gib, budget, usable)}, without dropout it "
                   f"{_outcome_words(ours, gib, budget, usable)}")
    return out


def _outcome_words(o, gib, budget: Optional[int] = None, usable: Optional[int] = None) -> str:
    """"fits at micro-batch 1, checkpointing (12.1 GiB)" / "does not fit (needs 15.2 GiB of the 12.8 GiB budget)" /
    "is tight (needs 13.3 GiB of the 12.8 GiB budget, within its margin)" (the verdict's words for the same need)."""
    if not o.fits:
        of = f" of the {gib(budget)} budget" if budget is not None else ""
        if usable is not None and o.need <= usable:
            return f"is tight (needs {gib(o.need)}{of}, within its margin)"
        return f"does not fit (needs {gib(o.need)}{of})"
    parts = [f"micro-batch {o.micro}"] + (["checkpointing"] if o.ckpt else []) + ([o.savers] if o.savers else [])
    return f"fits at {', '.join(parts)} ({gib(o.need)})"


def resolve_unplanned(cfg) -> dict:
    """The values of a run whose memory cannot be predicted (unknown architecture): as set, else no tiling and the
    default dropout."""
    out = {}
    if cfg.speed.tiled_mlp == "auto":
        out["speed.tiled_mlp"] = False
    if cfg.method.lora_dropout == "auto":
        out["method.lora_dropout"] = dropout_default(cfg)
    return out


def auto_settings(cfg, chosen: Variant) -> dict:
    """The resolved values of the ``auto`` fields this module owns for the chosen variant."""
    out = {}
    if cfg.speed.tiled_mlp == "auto":
        out["speed.tiled_mlp"] = chosen.tiled_mlp
    if cfg.method.lora_dropout == "auto":
        out["method.lora_dropout"] = chosen.lora_dropout
    return out
