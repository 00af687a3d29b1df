"""Plain-language reasons for a plan: what the budget is, what each choice costs, what was judged."""
from __future__ import annotations

from typing import Optional

from trainer.config.loading import explicit_keys
from trainer.core import capabilities
from trainer.core.units import GIB, MIB, count, gib, gib_difference
from trainer.planning.context import (
    Context,
    DsOption,
    generation_candidates,
    make_setup,
    fits,
    micro_options,
    need,
    per_rank_batch,
)
from trainer.planning import grpo_memory, picture_plan, timed
from trainer.planning.speed import OFFLOAD_MIN_GAIN
from trainer.planning.budget import usable_host_words
from trainer.planning.memory import Estimate, estimate

STATE_PARTS = ("weights", "gradients", "optimizer_states", "adapter_states", "vision_states", "zero3_gather",
               "in_backward_workspace", "paged_states_working_set")


def reasons(ctx: Context, mb: int, ckpt: bool, ds: DsOption, est: Estimate, verdict: str, found: dict,
            offload: bool = False, optimizer: str | None = None) -> list[str]:
    """Sentences for plan.json and the CLI, in the order a person would ask."""
    out = [_budget(ctx), _model(ctx, est)]
    out += objective_reasons(ctx, est)
    out.append(ctx.length.words)  # the sequence length planned for: data.seq_len or the data's longest sample
    out += picture_plan.words(ctx, make_setup(ctx, mb, ckpt, ds, offload, optimizer), est)
    out += _grpo(ctx, mb, ckpt, ds, est, offload, optimizer)
    out.append(_batch(ctx, mb, ckpt, ds, offload, optimizer, verdict, est))
    out.append(_checkpointing(ctx, mb, ckpt, ds, found, offload, optimizer, est))
    out += _deepspeed(ctx, ds, est, verdict, mb)
    out += _explicit(ctx, est, verdict)
    if verdict != "fits":
        out.append(_verdict(ctx, est, verdict))
    return [r for r in out if r]


def _budget(ctx: Context) -> str:
    """The budget as the subtraction the planner made, every term shown (the printed numbers add up)."""
    total, parts = ctx.budget_terms
    if ctx.device == "cpu":
        return f"training on the CPU, in host RAM: {gib_difference(total, parts, 'budget', 2)} (available when probed)"
    return f"{ctx.gpu.name}: {gib_difference(total, parts, 'budget', 2)}"


def _model(ctx: Context, est: Estimate) -> str:
    spec, c = ctx.spec, ctx.cfg
    states = sum(v for k, v in est.breakdown.items() if k in STATE_PARTS)
    what = {"full": "full fine-tune", "lora": f"LoRA r={c.method.lora_r}", "qlora": f"QLoRA r={c.method.lora_r}"}
    return (f"{spec.name}: {count(spec.params)} parameters; {what[c.method.type]} in {ctx.precision} keeps "
            f"{gib(states)} of weights, gradients and optimizer states on the "
            f"{'GPU' if ctx.device == 'cuda' else 'CPU'}")


def objective_reasons(ctx: Context, est: Estimate) -> list[str]:
    """What the objective and an encoder-decoder add, in words (DPO's reference, the pair, KTO's KL batch)."""
    c, b, out = ctx.cfg, est.breakdown, []
    t = c.training
    if t.objective in ("dpo", "orpo"):
        out.append(f"{t.objective.upper()}: each preference pair puts its chosen and rejected answers through the "
                   f"model in one step, so a pair costs the activations of two sequences (a pair counts as one "
                   f"sample of the effective batch)")
    if t.objective in ("dpo", "kto"):
        if c.method.type != "full":
            out.append("reference model: none in memory; with adapters the reference scores come from the same "
                       "weights with the adapters switched off")
        elif t.precompute_ref_log_probs:
            out.append("reference model: its log-probabilities are computed once before training "
                       "(precompute_ref_log_probs), so no copy stays in memory")
        else:
            where = "host RAM" if est.host_breakdown.get("reference_model") else ("GPU" if ctx.device == "cuda" else "RAM")
            size = b.get("reference_model") or est.host_breakdown.get("reference_model", 0)
            out.append(f"reference model: a frozen copy of the weights for the full fine-tune, {gib(size)} in {where} "
                       f"(set training.precompute_ref_log_probs: true to score the data once and drop it)")
    if t.objective == "kto":
        out.append("KTO: each step also scores a mismatched (KL) batch without gradients, "
                   f"{gib(b.get('reference_forward', 0))} of working memory with the reference forward; "
                   "micro-batches hold at least 2 examples")
    if ctx.spec is not None and ctx.spec.encoder_decoder:
        out.append(f"encoder-decoder: the input ({c.data.seq_len} tokens) runs through {ctx.spec.layers} encoder "
                   f"layers and the target through {ctx.spec.decoder_layers} decoder layers, each also attending to "
                   f"every input position (cross-attention)")
    return out


def _grpo(ctx: Context, mb: int, ckpt: bool, ds: DsOption, est: Estimate, offload: bool, optimizer: str | None) -> list[str]:
    """GRPO in words: the group geometry, both phases' peaks and what sets them, the reference, and what a larger
    generation batch would need (``ctx.cfg`` names the generation batch being judged)."""
    c = ctx.cfg
    if c.training.objective != "grpo" or not est.phases:
        return []
    g, per, gen = c.grpo, per_rank_batch(c), c.grpo.generation_batch_size
    sampling, update = est.phase_breakdown["sampling"], est.phase_breakdown["update"]
    prompt = ctx.seq - g.max_completion_length  # the longest prompt planned for
    out = [f"GRPO: {g.num_generations} completions per prompt, {per} per optimizer step per GPU; {gen} are sampled at "
           f"once ({gen // g.num_generations} prompts, {per // gen} sampling pass(es) per step, every {gen // mb} "
           f"micro-batch(es)) and trained on in micro-batches of {mb}",
           f"sampling peaks at {gib(est.phases['sampling'])}, {_sampling_words(ctx, mb, ckpt, ds, sampling, prompt)}; "
           f"the update peaks at {gib(est.phases['update'])} (micro-batch {mb} × {ctx.seq} tokens; TRL's "
           f"fused head scores the completion tokens without full logits)"]
    if g.beta <= 0:
        out.append("reference model: none (grpo.beta is 0: no KL term)")
    elif c.method.type != "full":
        out.append("reference model: none in memory; with adapters the reference log-probs come from the same weights "
                   "with the adapters switched off")
    else:
        out.append(f"reference model: a frozen copy of the weights for the KL term (grpo.beta {g.beta:g}), "
                   f"{gib(update.get('reference_model', 0))} in both phases")
    bigger = [o for o in generation_candidates(c, mb) if o > gen]
    if bigger and "grpo.generation_batch_size" not in explicit_keys(c) and fits(ctx, est):
        e = estimate(ctx.spec, make_setup(ctx, mb, ckpt, ds, offload, optimizer, min(bigger)))
        out.append(f"generation batch {gen} is the largest that fits beside the update ({min(bigger)} "
                   f"{_over_by(ctx, e.phases['sampling'], e, ' while sampling')})")
    return out


def _sampling_words(ctx: Context, mb: int, ckpt: bool, ds: DsOption, sampling: dict, prompt: int) -> str:
    """Where the sampling phase peaks, with its KV cache and transient in words."""
    c = ctx.cfg
    gen, done = c.grpo.generation_batch_size, gib(sampling.get("generation_kv_cache", 0))
    if "reference_forward" in sampling:
        return f"scoring the reference log-probs ({gib(sampling['reference_forward'])} of working memory)"
    if "old_policy_forward" in sampling:  # grpo.num_iterations > 1
        return (f"scoring the sampled completions' log-probs for the later iterations "
                f"({gib(sampling['old_policy_forward'])} of working memory)")
    if grpo_memory.generation_peak_point(ctx.spec, make_setup(ctx, mb, ckpt, ds)) == "prefill":
        full = gib(grpo_memory.kv_cache_bytes(ctx.spec, make_setup(ctx, mb, ckpt, ds), ctx.seq))
        return (f"in generate's prefill: KV cache {done} ({gen} sequences × {prompt} prompt tokens; {full} once the "
                f"{c.grpo.max_completion_length}-token completions are in), the prompts' forward "
                f"{gib(sampling.get('generation_forward', 0))}")
    return (f"at the last sampled token: KV cache {done} ({gen} sequences × {ctx.seq} tokens), a decoding step "
            f"{gib(sampling.get('generation_forward', 0))}")


def _batch(ctx: Context, mb: int, ckpt: bool, ds: DsOption, offload: bool = False, optimizer: str | None = None,
           verdict: str = "fits", est: Estimate | None = None) -> str:
    c = ctx.cfg
    per = per_rank_batch(c)
    accum = max(1, per // mb)
    tail = (f"accumulation {accum} × {c.world_size} GPU(s) keeps the effective batch at "
            f"{c.training.effective_batch_size} exactly")
    if c.training.micro_batch_size != "auto":
        return f"micro-batch {mb} is set {_source(ctx, 'training.micro_batch_size')}; {tail}"
    if verdict != "fits" and est is not None:  # nothing fits: the smallest micro-batch was planned
        return f"micro-batch {mb} is the smallest this effective batch allows, and even it {_over(ctx, est)}; {tail}"
    bigger = [m for m in micro_options(c) if m > mb]
    if not bigger:
        return f"micro-batch {mb} is the whole per-GPU batch; {tail}"
    nxt = min(bigger)
    e = estimate(ctx.spec, make_setup(ctx, nxt, ckpt, ds, offload, optimizer))
    return f"micro-batch {mb} is the largest that fits ({nxt} {_over_by(ctx, need(ctx, e), e)}); {tail}"


def _over_by(ctx: Context, what: int, est: Estimate, where: str = "") -> str:
    """Why the next size up does not fit, with the number that is over: the budget (printed to enough digits to
    see it is over), or host RAM when its offloaded activations are what does not fit."""
    if what <= ctx.budget and ctx.device == "cuda" and est.host_ram_bytes > ctx.host_budget:
        return (f"would need {gib(est.host_ram_bytes)} of host RAM{where}, over the {gib(ctx.host_budget)} "
                f"usable; its {gib(what)} of VRAM would fit")
    if round(what / GIB, 1) > round(ctx.budget / GIB, 1):
        return f"would need {gib(what)}{where}"
    over_mib = max(1, round((what - ctx.budget) / MIB))
    return f"would need {gib(what, 2)}{where}, {over_mib} MiB over the {gib(ctx.budget, 2)} budget"


def _over(ctx: Context, est: Estimate) -> str:
    """What a plan that does not fit is over, with both numbers (bytes as GiB)."""
    if need(ctx, est) > ctx.usable:
        return f"is over the budget ({gib(need(ctx, est))} of {gib(ctx.budget)})"
    if need(ctx, est) > ctx.budget:
        return f"eats into the headroom ({gib(need(ctx, est))} of a {gib(ctx.budget)} budget)"
    return f"needs {gib(est.host_ram_bytes)} of host RAM ({gib(ctx.host_budget)} usable)"


def _checkpointing(ctx: Context, mb: int, ckpt: bool, ds: DsOption, found: dict, offload: bool = False,
                   optimizer: str | None = None, est: Estimate | None = None) -> str:
    if ctx.cfg.speed.gradient_checkpointing != "auto":
        return f"gradient checkpointing {'on' if ckpt else 'off'} as set {_source(ctx, 'speed.gradient_checkpointing')}"
    if not ckpt and not found and est is not None:  # nothing fits: off because it would not help
        return _checkpointing_no_help(ctx, mb, ds, offload, optimizer, est)
    times = timed.checkpointing_pays(ctx, found, (ds, offload, optimizer or ctx.cfg.training.optimizer))[1] \
        if found else None
    if not ckpt:
        if times:  # both fit: off, since its larger micro-batch does not pay for the recompute
            return (f"gradient checkpointing off: not needed, and with it micro-batch {found[True][0]} instead of "
                    f"{found[False][0]} is estimated ≈ {times[True]:.2f} s per optimizer step against "
                    f"{times[False]:.2f} s without: not {OFFLOAD_MIN_GAIN:.0%} faster, so no recompute)")
        return "gradient checkpointing off: not needed, so no recomputation slows the steps"
    if False in found:
        timing = (f"; estimated ≈ {times[True]:.2f} s per optimizer step against {times[False]:.2f} s without, "
                  f"at least {OFFLOAD_MIN_GAIN:.0%} faster: the bigger batch keeps the card busier than the recompute "
                  "costs" if times else "")
        return (f"gradient checkpointing on: without it only micro-batch {found[False][0]} fits "
                f"({found[False][0] * ctx.seq} tokens), with it {mb}{timing}")
    e = estimate(ctx.spec, make_setup(ctx, min(micro_options(ctx.cfg)), False, ds, offload, optimizer))
    if est is None or need(ctx, e) <= need(ctx, est):
        return ""  # it does not lower the peak: the savings' sentence says why it is on and what it costs
    return (f"gradient checkpointing on: without it even the smallest micro-batch needs {gib(need(ctx, e))} "
            f"({gib(need(ctx, est))} with it)")


def _checkpointing_no_help(ctx: Context, mb: int, ds: DsOption, offload: bool, optimizer: Optional[str],
                           est: Estimate) -> str:
    """Why checkpointing is off on a plan that does not fit: with it the need would not be lower (the planner
    kept the least memory it could find), or (CPU) the planner does not checkpoint there."""
    if ctx.device != "cuda":
        return ("gradient checkpointing off: the planner plans CPU runs without it (speed.gradient_checkpointing: "
                "true trades recompute for memory)")
    e = estimate(ctx.spec, make_setup(ctx, mb, True, ds, offload, optimizer))
    if need(ctx, e) >= need(ctx, est):
        return (f"gradient checkpointing off: it would not lower this plan's peak ({gib(need(ctx, e))} with it, "
                f"{gib(need(ctx, est))} without): what is over the budget is not the layers' activations")
    return (f"gradient checkpointing off: with it the peak would be {gib(need(ctx, e))} (not "
            f"{gib(need(ctx, est))}), but it would need {gib(e.host_ram_bytes)} of host RAM, "
            f"{gib(ctx.host_budget)} usable")


def _deepspeed(ctx: Context, ds: DsOption, est: Estimate, verdict: str = "fits", mb: int = 1) -> list[str]:
    c = ctx.cfg
    if not ds[0]:
        if c.deepspeed.enabled == "auto" and ctx.device == "cuda":
            return [_deepspeed_off(ctx, est, verdict, mb)]
        return []
    head = f"as set {_source(ctx, 'deepspeed.enabled')}" if c.deepspeed.enabled is True else "chosen because plainer setups do not fit"
    parts = [f"ZeRO-{ds[1]}"] + (["optimizer offload"] if ds[2] else []) + (["parameter offload"] if ds[3] else [])
    out = [f"DeepSpeed {' + '.join(parts)} ({head})"]
    if c.world_size == 1 and not ds[2]:
        out.append(f"on one GPU ZeRO-{ds[1]} shards nothing: only offload moves memory off the GPU "
                   "(ZeRO-2 keeps all 16-bit weights on the GPU)")
    if ds[2] or ds[3]:
        out.append(f"offload needs {gib(est.host_ram_bytes)} of host RAM in all, of the "
                   f"{usable_host_words(ctx.hardware.host.ram_available_bytes)}")
    return out


def _deepspeed_off(ctx: Context, est: Estimate, verdict: str, mb: int) -> str:
    """Why DeepSpeed is off, from the numbers: everything fits without it, or what its offload would need."""
    states = sum(v for k, v in est.breakdown.items() if k in STATE_PARTS)
    if verdict == "fits":
        return (f"DeepSpeed off: the model states ({gib(states)}) and everything else fit the budget without it "
                "(it would only add overhead)")
    if ctx.cfg.method.type == "qlora":
        return "DeepSpeed off: QLoRA's 4-bit weights are not sharded or offloaded by DeepSpeed here"
    if not capabilities.installed("deepspeed"):
        return (f"DeepSpeed off: it is not installed, so its offload of the {gib(states)} of model states to host RAM "
                "cannot be planned (pip install --no-build-isolation deepspeed)")
    ckpt = ctx.cfg.speed.gradient_checkpointing
    off = estimate(ctx.spec, make_setup(ctx, mb, ckpt if isinstance(ckpt, bool) else True, (True, 3, True, True)))
    if off.host_ram_bytes > ctx.host_budget:
        return (f"DeepSpeed off: offloading the model states to host RAM would need {gib(off.host_ram_bytes)} of it, "
                f"{gib(ctx.host_budget)} usable")
    return (f"DeepSpeed off: even offloading parameters and optimizer states (ZeRO-3) leaves "
            f"{gib(need(ctx, off))} on the GPU, more than this plan's {gib(need(ctx, est))}")


def _explicit(ctx: Context, est: Estimate, verdict: str) -> list[str]:
    """Judge values the user set explicitly: they are kept even when they do not fit."""
    if verdict == "fits":
        return []
    c, out = ctx.cfg, []
    fixed = [k for k, v in (("training.micro_batch_size", c.training.micro_batch_size),
                            ("speed.gradient_checkpointing", c.speed.gradient_checkpointing),
                            ("deepspeed.enabled", c.deepspeed.enabled)) if v != "auto"]
    if c.training.objective == "grpo" and "grpo.generation_batch_size" in explicit_keys(c):
        fixed.append("grpo.generation_batch_size")
    mine = [k for k in fixed if k in explicit_keys(c)]
    if mine:
        out.append(f"values set in your config were kept, not changed: {', '.join(mine)}")
    if len(mine) < len(fixed):
        out.append(f"the tier preset's values were kept: {', '.join(k for k in fixed if k not in mine)}")
    return out


def _source(ctx: Context, key: str) -> str:
    """Who set a value: the user's config, or the hardware tier's preset layered under it."""
    return "in your config" if key in explicit_keys(ctx.cfg) else "by the tier preset"


def _verdict(ctx: Context, est: Estimate, verdict: str) -> str:
    need = est.peak_bytes if ctx.device == "cuda" else est.host_ram_bytes
    if verdict == "tight":
        return (f"tight: the predicted peak {gib(need)} eats into the headroom (budget {gib(ctx.budget)}, "
                f"usable {gib(ctx.usable)}); it may run, but other programs could push it out of memory")
    problems = []
    if need > ctx.budget:
        where = "VRAM" if ctx.device == "cuda" else "host RAM"
        problems.append(f"the predicted peak {gib(need)} is over the {where} budget {gib(ctx.budget)}")
    if ctx.device == "cuda" and est.host_ram_bytes > ctx.host_budget:
        problems.append(f"it needs {gib(est.host_ram_bytes)} of host RAM, only {gib(ctx.host_budget)} usable")
    return f"does not fit: {' and '.join(problems)}; see the alternatives"
