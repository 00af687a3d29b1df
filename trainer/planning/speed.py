"""How long a step takes, roughly (seconds): enough to choose between two ways of fitting — gradient checkpointing
(recompute every layer's forward in backward) and activation offload (move the saved activations over PCIe and
back). No torch.

Compute time is the step's matrix FLOPs (``flops.flops_per_token``, the plan's one count) over the card's published
dense 16-bit tensor peak times ``MFU``; offload's copies run on a second CUDA stream beside the compute, so a
micro-batch takes the longer of its compute and its PCIe
time. Measured on an H100 (PCIe 5 x16; docs/design.md, issue 31), Llama-3.2-1B full fine-tune, micro-batch 4, seq 2048:
checkpointing 40.2k tokens/s, offload without checkpointing 15.4k — offload was bound by the link. These formulas
give 43k and 15.4k there: ``PCIE_EFFICIENCY`` was fitted on that one run (in-sample), ``MFU`` is the 46% measured
for the default path at micro-batch 8 on the same card.
"""
from __future__ import annotations

from typing import Optional

from trainer.planning.flops import flops_per_token

MFU = 0.45  # share of the dense tensor peak a step reaches (46% measured: H100, Llama-3.2-1B, micro-batch 8)
PCIE_EFFICIENCY = 0.85  # pinned host <-> GPU copies reach this share of the link's signalling rate (fitted, see above)
# Offload replaces checkpointing only when estimated this much faster: the estimates are rough, and checkpointing needs
# no pinned host RAM and no second stream's timing to hold.
OFFLOAD_MIN_GAIN = 0.10

# Dense 16-bit tensor peaks with fp32 accumulation (FLOP/s), from NVIDIA's data sheets and architecture whitepapers
# (GeForce cards accumulate in fp32 at half their fp16-accumulate rate). The RTX 4090 Laptop GPU has no published
# figure: 76 SMs × 512 FLOP per clock (Ada, fp32 accumulate) × 2.04 GHz boost. The first name that is a substring of
# the GPU's name wins, so longer names come first. A card not listed gets no time estimate. The RTX 3060 and the
# RTX 5060 Ti have no published figure either: SMs × 512 FLOP per clock (Ampere and Blackwell GeForce, fp32
# accumulate: the 3090's 71 TFLOPS are 82 SMs × 512 × 1.695 GHz, the 5090's 209.5 are 170 × 512 × 2.407 GHz) × the
# rated boost clock: 28 × 512 × 1.777 GHz and 36 × 512 × 2.572 GHz.
PEAK_16BIT = (
    ("h100 nvl", 835e12), ("h100 pcie", 756e12), ("h100", 989.4e12), ("h200", 989.4e12), ("b200", 2250e12),
    ("a100", 312e12), ("l40s", 362e12), ("l40", 181e12), ("l4", 121e12), ("rtx 6000 ada", 364.2e12),
    ("a6000", 154.8e12), ("a40", 149.7e12), ("a10", 125e12), ("v100", 125e12), ("t4", 65e12),
    ("rtx 5090 laptop", None), ("rtx 5090", 209.5e12), ("rtx 4090 laptop", 79.4e12), ("rtx 4090", 165.2e12), ("rtx 4080", 97.5e12),
    ("rtx 5060 ti", 47.4e12), ("rtx 3090 ti", 80e12), ("rtx 3090", 71e12), ("rtx 3080", 59.5e12),
    ("rtx 3060 ti", None), ("rtx 3060 laptop", None), ("rtx 3060", 25.5e12),
)


def peak_flops(gpu_name: Optional[str]) -> Optional[float]:
    """The card's dense 16-bit tensor peak (FLOP/s) by name, or None for a card not in ``PEAK_16BIT``."""
    name = (gpu_name or "").lower()
    return next((flops for key, flops in PEAK_16BIT if key in name), None)


def step_seconds(spec, s, gpu_name: Optional[str], pcie_bytes_per_second: Optional[float], offloaded: int) -> dict:
    """One micro-batch's estimated time (seconds): ``compute`` (with checkpointing's recompute), ``pcie`` (offload's
    copies out and back, 0 without offload) and ``total`` (the longer of the two: the copies overlap compute).
    Empty when the card's peak or (with offload) its PCIe link is unknown."""
    peak = peak_flops(gpu_name)
    if peak is None or (offloaded and not pcie_bytes_per_second):
        return {}
    tokens = s.micro_batch * s.sequences_per_sample * s.seq_len
    flops = tokens * flops_per_token(spec, s)  # with checkpointing's recompute and the tiled MLP's
    compute = flops / (peak * MFU)
    pcie = pcie_seconds(offload_copies(offloaded), pcie_bytes_per_second) if offloaded else 0.0
    return {"compute": compute, "pcie": pcie, "total": max(compute, pcie)}


def offload_copies(offloaded: int) -> int:
    """Bytes activation offload moves over PCIe for ``offloaded`` saved bytes: out in forward, back in backward."""
    return 2 * offloaded


def pcie_seconds(moved: int, pcie_bytes_per_second: float) -> float:
    """The time ``moved`` bytes take over the PCIe link (pinned copies at ``PCIE_EFFICIENCY`` of its rate)."""
    return moved / (pcie_bytes_per_second * PCIE_EFFICIENCY)
