"""The plan's one time model: seconds per optimizer step of a setup on a card (``optimizer_step``). Every decision a
plan makes by time reads it: gradient checkpointing on or off where both fit (``timed.checkpointing_pays``),
checkpointing against activation offload and the tiled MLP against paged optimizer states (``planning.timed``), a
costlier layer variant for its larger micro-batch (``kernels.better``, with the search's early stop at the card's
``busy_share``), the loss kernel (``planning.search`` for ``loss_kernel.decide``) and the set of GPUs
(``planning.gpus``, a model's layers split over cards included). No torch. Seconds, bytes.

One optimizer step is ``s.gradient_accumulation`` micro-batches on each of ``s.world`` ranks, then the update:

- **Compute** of a micro-batch: its matrix FLOPs (``flops.flops_per_token`` × its tokens: checkpointing's recompute
  and the tiled MLP's second forward included) over the card's published dense 16-bit peak × ``SUSTAINED`` ×
  ``throughput.utilisation`` of its tokens (n / (n + n½): a fixed cost per micro-batch beside the FLOPs, fitted on
  an H100; n½ scales with the card's peak, ``half_busy``). ``SUSTAINED`` is set so that the fit's point —
  Llama-3.2-1B, micro-batch 8 at sequence 2,048 on the H100, where 46% MFU was measured — gives ``MFU``.
- **Copies beside the compute** (a second CUDA stream; a micro-batch takes the longer of its compute and its
  copies): activation offload's saved activations out in forward and back in backward; DeepSpeed's ZeRO-Offload
  moving each rank's share of the gradients to the host every micro-batch (DeepSpeed accumulates them in the host's
  fp32 buffer) and, with parameter offload, each rank's share of the weights in for forward and again for backward.
- **The host's step**, once per optimizer step and not overlapped (the next forward needs its weights): ZeRO-Offload's
  CPU Adam over the trainable parameters (each machine steps its ranks' shares: the host's cores are shared, so it is
  the machine's whole share at ``CPU_ADAM_PARAMS_PER_SECOND``), and the updated 16-bit weights back to each rank over
  its link; bitsandbytes' paged states crossing PCIe (``optimizer_memory.paging_bytes_per_step``: each state in and
  out, an upper bound).
- **The exchange** between ranks (``exchange_bytes``) over the set's slowest link, after the compute (not overlapped).

Every copy runs at ``PCIE_EFFICIENCY`` of the link's signalling rate. Measured on an H100 (PCIe 5 x16; docs/design.md,
issue 31), Llama-3.2-1B full fine-tune, micro-batch 4, seq 2048: checkpointing 40.2k tokens/s, offload without
checkpointing 15.4k — offload was bound by the link. The model gives 35.6k and 15.4k there: ``PCIE_EFFICIENCY`` was
fitted on that run (in-sample). A prior for ranking setups of one run, not a prediction of tokens/s.
"""
from __future__ import annotations

from typing import Optional

from trainer.planning.flops import flops_per_token
from trainer.planning.optimizer_memory import paging_bytes_per_step
from trainer.planning.setup import TrainSetup
from trainer.planning.throughput import HALF_BUSY_TOKENS, half_busy_tokens, utilisation

MFU = 0.45  # the peak's share a step reaches at the fit's point (46% measured: H100, Llama-3.2-1B, micro-batch 8)
FIT_TOKENS = 8 * 2048  # the fit's point: micro-batch 8 at sequence 2,048 (Llama-3.2-1B: n½ = HALF_BUSY_TOKENS)
SUSTAINED = MFU / utilisation(FIT_TOKENS, HALF_BUSY_TOKENS)  # the share a micro-batch of unbounded size would reach
PCIE_EFFICIENCY = 0.85  # pinned host <-> GPU copies reach this share of the link's signalling rate (fitted, see above)
# DeepSpeed's CPU Adam (ZeRO-Offload's optimizer step on the host): its authors measured it updating an 11.6B-parameter
# GPT-2 in 8.2 s (against 56 s for torch's Adam; deepspeedai/DeepSpeed pull request 735, 2021), 1.4e9 parameters/s. The
# ZeRO-Offload paper (Ren et al., USENIX ATC 2021) says 5-7x torch's CPU Adam; a desktop's two memory channels stream
# fewer bytes than that server's, so this is rather an upper bound on a consumer machine's rate.
CPU_ADAM_PARAMS_PER_SECOND = 1.4e9
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


REFERENCE_PEAK = 989.4e12  # the H100 SXM's: the card the utilisation was fitted on (n½ = half_busy_tokens there)


def half_busy(spec, s: TrainSetup, peak: float) -> float:
    """n½ of ``s`` on a card of dense 16-bit ``peak`` (tokens per micro-batch at which it is half busy): the fitted
    fixed cost per micro-batch is time, so the tokens that take as long grow with the card's speed — a card with a
    tenth of the H100's peak is half busy at a tenth of the tokens (``throughput.half_busy_tokens`` is the H100's)."""
    return half_busy_tokens(spec, s) * peak / REFERENCE_PEAK


def compute_seconds(spec, s: TrainSetup, peak: float) -> float:
    """One micro-batch's compute (seconds) on a card of dense 16-bit ``peak``: its FLOPs at the utilisation of its
    tokens (see the module docstring)."""
    tokens = s.micro_batch * s.sequences_per_sample * s.seq_len
    busy = SUSTAINED * utilisation(tokens, half_busy(spec, s, peak))
    return tokens * flops_per_token(spec, s) / (peak * busy)


def busy_share(spec, s: TrainSetup, gpu_name: Optional[str]) -> Optional[float]:
    """The share of the card a micro-batch of ``s`` keeps busy, the utilisation the time model computes it at (0-1):
    a larger micro-batch can be at most 1 / this faster. None where the card's peak is unknown (the CPU, a card not
    in ``PEAK_16BIT``): the fitted utilisation is a GPU's, and no larger micro-batch is preferred for speed there."""
    peak = peak_flops(gpu_name)
    if peak is None:
        return None
    return utilisation(s.micro_batch * s.sequences_per_sample * s.seq_len, half_busy(spec, s, peak))


def optimizer_step(spec, s: TrainSetup, est, gpu_name: Optional[str], link: Optional[float],
                   exchange_link: Optional[float] = None) -> dict:
    """One optimizer step of ``s`` (its ``gradient_accumulation`` micro-batches, ``world`` ranks) on the card
    ``gpu_name`` with PCIe ``link`` (bytes/s, one direction; None: not reported), ``est`` its memory estimate (the
    bytes offloaded or paged, the trainable parameters), ``exchange_link`` the slowest link of the set's cards (this
    card's when None). Seconds: ``compute`` (the micro-batches' compute), ``copies`` (their copies beside it),
    ``micro_batches`` (each the longer of the two, summed), ``host`` (CPU Adam), ``host_copies`` (weights back, paged
    states), ``exchange``, ``total``; bytes: ``offloaded`` (activation offload's per step), ``moved`` (every host copy
    per step), ``bytes`` (exchanged per rank). Empty when the card's peak, or a link something crosses, is unknown."""
    peak = peak_flops(gpu_name)
    if peak is None:
        return {}
    n = max(1, s.gradient_accumulation)
    per_micro = _per_micro_copies(spec, s, est)
    after = _host_copies(spec, s, est)
    exchanged = exchange_bytes(est.trainable_params, spec.params, s, n, s.world)
    exchange_link = exchange_link or link
    if ((per_micro["activations"] or per_micro["states"] or after) and not link) or (exchanged and not exchange_link):
        return {}
    compute = compute_seconds(spec, s, peak)
    copies = pcie_seconds(per_micro["activations"] + per_micro["states"], link) if link else 0.0
    host = host_adam_seconds(est.trainable_params, s)
    host_copies = pcie_seconds(after, link) if after else 0.0
    exchange = exchanged / (exchange_link * PCIE_EFFICIENCY) if exchanged else 0.0
    total = n * max(compute, copies) + host + host_copies + exchange
    return {"compute": n * compute, "copies": n * copies, "micro_batches": n * max(compute, copies), "host": host,
            "host_copies": host_copies, "exchange": exchange, "total": total,
            "offloaded": n * per_micro["activations"],
            "moved": n * (per_micro["activations"] + per_micro["states"]) + after, "bytes": exchanged}


def ranking_seconds(spec, s: TrainSetup, est, gpu_name: Optional[str], link: Optional[float]) -> float:
    """Seconds per optimizer step to rank setups of one run by (the loss kernel's): ``optimizer_step``'s total where
    it is known; where the card's peak or a link is not (the CPU, a card not in ``PEAK_16BIT``), the micro-batches'
    compute alone on the card the utilisation was fitted on (``REFERENCE_PEAK``): two setups' compute compares the same
    whatever the peak's scale, their copies do not, and are left out there."""
    known = optimizer_step(spec, s, est, gpu_name, link)
    if known:
        return known["total"]
    return max(1, s.gradient_accumulation) * compute_seconds(spec, s, REFERENCE_PEAK)


def _per_micro_copies(spec, s: TrainSetup, est) -> dict:
    """Bytes one rank moves over its link per micro-batch beside the compute: ``activations`` (activation offload's,
    out and back) and ``states`` (ZeRO-Offload's gradient share to the host; parameter offload's weight share in, for
    forward and for backward)."""
    states = 0
    if s.deepspeed and s.offload_optimizer:
        width, share = s.activation_width, 1 / max(1, s.world)
        states += int(est.trainable_params * share * width)
        if s.offload_params:
            states += int(2 * spec.params * share * width)
    return {"activations": offload_copies(est.host_breakdown.get("offloaded_activations", 0)), "states": states}


def _host_copies(spec, s: TrainSetup, est) -> int:
    """Bytes one rank moves over its link once per optimizer step, after its micro-batches: ZeRO-Offload's updated
    16-bit weights back (each rank its share; with parameter offload they stay on the host), and the paged optimizer
    states in and out (``paging_bytes_per_step``)."""
    from_host = paging_bytes_per_step(est.host_breakdown)
    if s.deepspeed and s.offload_optimizer and not s.offload_params:
        from_host += int(est.trainable_params / max(1, s.world) * s.activation_width)
    return from_host


def host_adam_seconds(trainable: int, s: TrainSetup) -> float:
    """ZeRO-Offload's optimizer step on the host (0 without it): CPU Adam over this machine's ranks' shares of the
    trainable parameters (the whole model over all of its ranks: they share the host's cores) at
    ``CPU_ADAM_PARAMS_PER_SECOND``."""
    if not (s.deepspeed and s.offload_optimizer):
        return 0.0
    return trainable / max(1, s.num_nodes) / CPU_ADAM_PARAMS_PER_SECOND


def exchange_bytes(trainable: int, params: int, setup: TrainSetup, micro_batches: int, ranks: int) -> int:
    """Bytes each rank sends (and receives) per optimizer step over the ring (a ring moves (N−1)/N of a tensor per
    rank for a reduce-scatter or an all-gather, twice that for an all-reduce). DDP exchanges gradients in the
    weights' dtype (``TrainSetup.weight_width``); DeepSpeed in the 16-bit compute dtype (``activation_width``).

    - DDP: one all-reduce of the trainable gradients per optimizer step (no exchange in the accumulation steps).
    - ZeRO-2: a reduce-scatter of the gradients every micro-batch, an all-gather of the updated weights per step.
    - ZeRO-3: every micro-batch gathers all weights for forward and again for backward, and reduce-scatters the
      gradients; the step updates shards in place."""
    if ranks < 2:
        return 0
    width = setup.activation_width if setup.deepspeed else setup.weight_width
    share = (ranks - 1) / ranks
    grads = trainable * width
    if not setup.deepspeed:
        return int(2 * share * grads)
    if setup.zero_stage == 3:
        return int(micro_batches * share * (2 * params * width + grads))
    return int(micro_batches * share * grads + share * trainable * width)


def offload_copies(offloaded: int) -> int:
    """Bytes activation offload moves over PCIe for ``offloaded`` saved bytes: out in forward, back in backward."""
    return 2 * offloaded


def pcie_seconds(moved: int, pcie_bytes_per_second: float) -> float:
    """The time ``moved`` bytes take over the PCIe link (pinned copies at ``PCIE_EFFICIENCY`` of its rate)."""
    return moved / (pcie_bytes_per_second * PCIE_EFFICIENCY)
