"""What each memory saver in a plan saves: "without X it would need Y GiB". Bytes and seconds. No torch.

A saver's saving is the planned peak with that saver taken out (everything else, micro-batch included,
kept) minus the planned peak. Activation offload also costs host RAM and PCIe time: the bytes moved
(out in forward, back in backward, every micro-batch of an optimizer step) over the link's one-way rate
from the hardware snapshot, an upper bound of the time added (TRL overlaps the copies with compute on a
second CUDA stream, so the real cost is lower whenever compute is the longer of the two).
"""
from __future__ import annotations

from dataclasses import replace

from trainer.config.placements import DEFAULT, placement
from trainer.core.units import LEAST_PRINTED, gib
from trainer.planning import throughput
from trainer.planning.kernels import DROPOUT
from trainer.planning.context import Context, make_setup, need, per_rank_batch
from trainer.planning.memory import Estimate, TrainSetup, estimate
from trainer.planning.speed import offload_copies, pcie_seconds

WORDS = {"chunked_loss": "chunked loss (exact)", "liger_loss": "Liger's fused loss (exact)",
         "gradient_checkpointing": "gradient checkpointing", "tiled_mlp": "tiled MLP (exact)",
         "lora_dropout": "no LoRA dropout",
         "activation_offload": "activation offload", "optimizer_8bit": "8-bit AdamW (approximate)",
         "deepspeed_offload": "DeepSpeed offload"}


def _without(s: TrainSetup, dropout_chosen: bool = False) -> list[tuple[str, TrainSetup]]:
    """(saver, the same setup without it) for every saver ``s`` uses; ``dropout_chosen``: the planner set the
    adapters' dropout to 0 (against the default's copies)."""
    out = []
    if s.tiled_mlp:
        out.append(("tiled_mlp", replace(s, tiled_mlp=False)))
    if dropout_chosen and s.lora_dropout == 0 and s.method in ("lora", "qlora"):
        out.append(("lora_dropout", replace(s, lora_dropout=DROPOUT)))
    if not s.full_logits:  # against HF's loss at the same settings
        out.append((f"{s.loss_kernel}_loss", replace(s, loss_kernel="hf")))
    if s.checkpointing:
        out.append(("gradient_checkpointing", replace(s, checkpointing=False)))
    if s.activation_offload and s.device == "cuda":
        out.append(("activation_offload", replace(s, activation_offload=False)))
    if placement(s.optimizer).eight_bit and not s.deepspeed and s.method == "full":
        out.append(("optimizer_8bit", replace(s, optimizer=DEFAULT)))
    if s.deepspeed and (s.offload_optimizer or s.offload_params):
        out.append(("deepspeed_offload", replace(s, deepspeed=False, offload_optimizer=False, offload_params=False)))
    return out


def savings(ctx: Context, mb: int, ckpt: bool, level, est: Estimate) -> list[dict]:
    """One dict per saver in the chosen settings: ``saver``, ``label``, ``saves_bytes``, ``without_bytes``
    (the need without it: GPU peak, or host RAM on the CPU); activation offload adds ``host_ram_bytes`` and
    ``pcie_bytes_per_step``, and ``pcie_seconds_per_step`` when the snapshot reports the PCIe link."""
    if ctx.spec is None:
        return []
    ds, off, opt = level
    setup = make_setup(ctx, mb, ckpt, ds, off, opt)
    have = need(ctx, est)
    out = []
    for saver, other in _without(setup, ctx.cfg.method.lora_dropout == "auto"):
        alt = estimate(ctx.spec, other)
        without = need(ctx, alt)
        row = {"saver": saver, "label": WORDS[saver], "saves_bytes": without - have, "without_bytes": without,
               "without_host_ram_bytes": alt.host_ram_bytes}
        if saver == "activation_offload":
            row.update(_offload_cost(ctx, mb, est))
        if saver == "tiled_mlp":
            row["compute_share"] = round(throughput.tiled_mlp_cost(ctx.spec, setup), 4)
        out.append(row)
    return out


def _offload_cost(ctx: Context, mb: int, est: Estimate) -> dict:
    """Host RAM held and PCIe traffic of activation offload, per optimizer step (an estimate)."""
    per_micro = est.host_breakdown.get("offloaded_activations", 0)
    steps = max(1, per_rank_batch(ctx.cfg) // mb)
    moved = offload_copies(per_micro) * steps
    rate = ctx.gpu.pcie_bytes_per_second if ctx.gpu is not None else None
    row = {"host_ram_bytes": per_micro, "pcie_bytes_per_step": moved, "pcie_seconds_per_step": None}
    if rate:
        row["pcie_seconds_per_step"] = round(pcie_seconds(moved, rate), 3)
        row["pcie_bytes_per_second"] = int(rate)
    return row


SAVES_AT_LEAST = LEAST_PRINTED  # bytes: a saving that prints as 0.0 GiB is no saving to claim


def saves(row: dict) -> bool:
    """True when the saver of ``row`` lowers the need by a printable amount (at least 0.05 GiB)."""
    return row["saves_bytes"] >= SAVES_AT_LEAST


def saver_words(ctx: Context, r: dict) -> str:
    """What a saver does here, from its row's numbers: what it saves, or — when it saves nothing — why it is on
    (without it host RAM would run out; it was set; it is free and exact) and what it costs."""
    where = "VRAM" if ctx.device == "cuda" else "host RAM"
    if saves(r):
        return f"{r['label']}: saves {gib(r['saves_bytes'])}; without it this would need {gib(r['without_bytes'])} of {where}"
    more = -r["saves_bytes"]
    cost = (f"it costs {gib(more)} of {where} here ({gib(r['without_bytes'])} without it)" if more >= SAVES_AT_LEAST
            else f"it saves no {where} here ({gib(r['without_bytes'])} without it too)")
    host = r.get("without_host_ram_bytes") or 0
    if ctx.device == "cuda" and host > ctx.host_budget:
        return (f"{r['label']}: on because without it host RAM would run out ({gib(host)} needed, "
                f"{gib(ctx.host_budget)} usable); {cost}")
    return f"{r['label']}: {cost}"


def savings_reasons(ctx: Context, rows: list[dict]) -> list[str]:
    """One sentence per saver: what it saves and what the run would need without it (``saver_words``)."""
    out = []
    for r in rows:
        text = saver_words(ctx, r)
        if r["saver"] == "activation_offload":
            text += f"; it holds {gib(r['host_ram_bytes'])} of pinned host RAM and moves {gib(r['pcie_bytes_per_step'])} " \
                    "over PCIe per optimizer step"
            if r.get("pcie_seconds_per_step") is not None:
                text += (f", about {r['pcie_seconds_per_step']:.2f} s at the link's {r['pcie_bytes_per_second'] / 1e9:.0f} GB/s "
                         "(an estimate and an upper bound: the copies overlap compute)")
        if r["saver"] == "tiled_mlp":
            text += (f"; it costs about {r['compute_share']:.0%} more compute (each tile's forward runs again in "
                     "backward)")
            if ctx.cfg.method.type == "qlora":
                text += (", and under QLoRA each tile dequantizes the MLP's 4-bit weights again: measured on an H200, "
                         "a 1B-shaped QLoRA Llama at 16k tokens ran 2.2× slower tiled (Llama-3.1-8B at 48k: 4,449 "
                         "tokens/s)")
        if r["saver"] == "lora_dropout":
            text += "; training differs: the adapters' inputs are not dropped out (no dropout regularisation)"
        if r["saver"] == "optimizer_8bit":
            text += ("; numerics change: AdamW's two moment states are kept in 8 bits with block-wise scales "
                     "(bitsandbytes), so updates differ slightly from 32-bit AdamW")
        out.append(text)
    return out


def mask_reason(ctx: Context, setup: TrainSetup, est: Estimate) -> list[str]:
    """What the attention mask of packed (or padded) batches holds in this plan (``planning.packed_mask``): the
    breakdown's ``attention_mask`` component, the one home of that number, when it is printable; and what avoids
    it."""
    if ctx.spec is None or not setup.packed_mask:
        return []
    cost = est.breakdown.get("attention_mask", 0)
    if cost < SAVES_AT_LEAST:
        return []
    n = setup.seq_len
    why = ("packed blocks of several documents" if ctx.cfg.data.packing else
           f"micro-batches of {setup.micro_batch} sequences padded to the longest")
    fix = ("data.packing: false (one document per sequence, micro-batch 1) or model.attn_implementation: "
           "flash_attention_2 (it keeps documents apart without a mask)" if ctx.cfg.data.packing else
           "micro-batch 1 or model.attn_implementation: flash_attention_2")
    return [f"attention mask: {gib(cost)} here (the breakdown's attention_mask): {why} need a {n:,} × {n:,} mask per "
            f"sequence, which SDPA turns into a 16-bit bias in every layer that keeps it for backward (with K and V "
            f"repeated per head); {fix} needs none"]
