"""Where AdamW's states live (``training.optimizer``): the one table of optimizer-state placements.

Every reader takes its facts from a row here: the config's choices and their description (``config.sections``), the
planner's state bytes (``planning.optimizer_memory``), the placements it tries (``planning.search_space``,
``planning.in_backward_plan``), its words in reasons, alternatives and the Method page's options (``planning.verdict``),
what a placement needs of the machine (``planning.requirements``, ``config.cross_checks``), the optimizer the worker
builds (HF's ``optim`` name in ``worker.train.recipe``; bitsandbytes' class in the benchmarks), the checkpoint's
engine (``rundir.checkpoints``). A new placement is one new row.

It lives in ``trainer.config`` because the config's ``Literal`` is read from it and the config room is below every
other reader (planning, rundir, worker: docs/design.md's layer order; pyproject.toml's import-linter contract). Light:
no torch, no pydantic.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Placement:
    """One ``training.optimizer`` value and what it means.

    ``placed``: where and how wide, in a few words (the Method page's options, catalog_fit); ``states``: the states
    with their implementation (a plan's reasons); ``saver``: the placement as one memory saver beside others ("" for
    the plain one); ``doc``: its line in the config reference. ``state_width``: bytes per state element (AdamW keeps
    two per parameter): None for the weights' dtype (PyTorch's AdamW), 1 for bitsandbytes' blockwise 8-bit states
    (their absmax blocks: ``saver_memory.adam8_bytes``). ``paged``: CUDA managed memory, paged to host RAM.
    ``hf_optim``: HF ``TrainingArguments.optim`` (None: PyTorch's AdamW, fused when ``speed.fused_adamw``);
    ``bnb_class``: the ``bitsandbytes.optim`` class (None: ``torch.optim.AdamW``); ``package``: the optional package
    it needs (``core.capabilities`` names it); ``cuda_only``: it runs on an NVIDIA GPU only."""

    name: str
    placed: str
    states: str
    saver: str
    doc: str
    state_width: Optional[int]
    paged: bool
    eight_bit: bool
    hf_optim: Optional[str]
    bnb_class: Optional[str]
    package: Optional[str]
    cuda_only: bool

    @property
    def exact(self) -> bool:
        """The same update as PyTorch's AdamW (within fp32 rounding); 8-bit states are approximate."""
        return not self.eight_bit


PLACEMENTS: tuple[Placement, ...] = (  # the order the planner tries them in (exact first, on the GPU first)
    Placement("adamw", "states on the GPU", "PyTorch AdamW's states in the weights' dtype", "",
              "PyTorch's AdamW, states in the weights' dtype on the GPU (fused when speed.fused_adamw)",
              None, False, False, None, None, None, False),
    Placement("paged_adamw_32bit", "fp32 states paged to host RAM",
              "fp32 AdamW states (bitsandbytes' PagedAdamW32bit)", "fp32 AdamW states paged to host RAM",
              "fp32 states and the same update in CUDA managed memory, paged to host RAM under memory pressure "
              "(bitsandbytes' PagedAdamW32bit)",
              4, True, False, "paged_adamw_32bit", "PagedAdamW32bit", "bitsandbytes", True),
    Placement("adamw_8bit", "8-bit states on the GPU", "8-bit AdamW states (bitsandbytes' AdamW8bit)", "8-bit AdamW",
              "8-bit states on the GPU (bitsandbytes' AdamW8bit; approximate)",
              1, False, True, "adamw_bnb_8bit", "AdamW8bit", "bitsandbytes", True),
    Placement("paged_adamw_8bit", "8-bit states paged to host RAM",
              "8-bit AdamW states (bitsandbytes' PagedAdamW8bit)", "8-bit AdamW states paged to host RAM",
              "8-bit states paged to host RAM (bitsandbytes' PagedAdamW8bit; approximate)",
              1, True, True, "paged_adamw_8bit", "PagedAdamW8bit", "bitsandbytes", True),
)
NAMES: tuple[str, ...] = tuple(p.name for p in PLACEMENTS)
_BY_NAME = {p.name: p for p in PLACEMENTS}


def placement(name: str) -> Placement:
    """The row of a ``training.optimizer`` value (KeyError for a name the config would refuse)."""
    return _BY_NAME[name]


def hf_optim(name: str, fused_adamw: bool, use_cuda: bool) -> str:
    """HF ``TrainingArguments.optim`` for ``training.optimizer`` ``name``: the row's, or PyTorch's AdamW (its fused
    kernel when ``speed.fused_adamw`` on CUDA). The worker's Trainer and ``plan --measure`` both ask here."""
    return placement(name).hf_optim or ("adamw_torch_fused" if fused_adamw and use_cuda else "adamw_torch")


def find(*, paged: bool, eight_bit: bool) -> Placement:
    """The one placement with these properties."""
    return next(p for p in PLACEMENTS if p.paged == paged and p.eight_bit == eight_bit)


DEFAULT = find(paged=False, eight_bit=False).name  # PyTorch's AdamW on the GPU: the config's default
EIGHT_BIT = find(paged=False, eight_bit=True).name  # the 8-bit states the planner may choose (plan_allow_approximate)


def description() -> str:
    """``training.optimizer``'s description in the config reference."""
    rows = "; ".join(f"{p.name}: {p.doc}" for p in PLACEMENTS)
    return (f"Where AdamW's states live. {rows}. bitsandbytes' optimizers need an NVIDIA GPU. The planner proposes "
            "8-bit states only under plan_allow_approximate: true.")
