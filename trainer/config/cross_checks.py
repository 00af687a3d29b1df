"""Checks of the run config that span fields (torchtune-style: every problem at once). Each returns
``(field path, message with the fix)`` pairs; ``RunConfig``'s validator raises them together.
Light module, importing only the placement table and the fused step's rules (``in_backward``): ``RunConfig``
(``sections``) calls it, so it names that type only in annotations.
"""
from __future__ import annotations

from trainer.config import in_backward
from trainer.config.placements import DEFAULT, placement


class CrossCheckError(ValueError):
    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{a}: {b}" for a, b in problems))


def cross_check(cfg: RunConfig) -> list[tuple[str, str]]:
    """Checks that span fields. Returns ``(field path, message with the fix)`` pairs."""
    p: list[tuple[str, str]] = []
    t, ds = cfg.training, cfg.deepspeed
    ranks = cfg.world_size
    mb, ga = t.micro_batch_size, t.gradient_accumulation_steps
    if isinstance(mb, int):
        if t.effective_batch_size % (mb * ranks):
            p.append(("training.effective_batch_size",
                      f"{t.effective_batch_size} is not divisible by micro_batch_size {mb} × {ranks} GPU(s) = {mb * ranks}; "
                      f"use a multiple of {mb * ranks} or micro_batch_size: auto"))
        elif isinstance(ga, int) and mb * ga * ranks != t.effective_batch_size:
            p.append(("training.gradient_accumulation_steps",
                      f"{mb} × {ga} × {ranks} GPU(s) = {mb * ga * ranks}, not effective_batch_size "
                      f"{t.effective_batch_size}; set it to {t.effective_batch_size // (mb * ranks)} or 'auto'"))
    elif isinstance(ga, int) and t.effective_batch_size % (ga * ranks):
        p.append(("training.gradient_accumulation_steps",
                  f"effective_batch_size {t.effective_batch_size} is not divisible by {ga} × {ranks} GPU(s); use 'auto'"))
    gpus = cfg.distributed.gpus
    if isinstance(gpus, list) and gpus and len(gpus) != cfg.distributed.num_gpus:
        p.append(("distributed.gpus", f"names {len(gpus)} GPU(s) but distributed.num_gpus is "
                  f"{cfg.distributed.num_gpus}; list {cfg.distributed.num_gpus} card(s), or remove distributed.num_gpus "
                  "(the list then says how many)"))
    if cfg.distributed.launcher == "single" and ranks > 1:
        p.append(("distributed.launcher", f"'single' runs one process but {ranks} GPUs are configured; "
                  "set distributed.launcher: auto (or deepspeed / torchrun)"))
    if ds.offload_params and ds.zero_stage != 3:
        p.append(("deepspeed.offload_params", "parameter offload needs zero_stage: 3; set zero_stage: 3 or offload_params: false"))
    if ds.enabled is False and (ds.offload_optimizer or ds.offload_params):
        p.append(("deepspeed.enabled", "offload needs DeepSpeed; set deepspeed.enabled: true (or auto) or turn offload off"))
    m = cfg.method
    if m.lora_experts and m.type != "full" and m.lora_dropout != "auto" and m.lora_dropout > 0:
        p.append(("method.lora_experts", f"adapting the experts (PEFT's target_parameters) works only without "
                  f"adapter dropout, and method.lora_dropout is {m.lora_dropout}; set method.lora_dropout: 0, or "
                  f"method.lora_experts: false to adapt attention and dense layers only"))
    if cfg.method.type == "qlora" and ds.enabled is True and ds.zero_stage == 3:
        p.append(("method.type", "QLoRA 4-bit weights cannot be sharded by ZeRO-3; use zero_stage 2 or no DeepSpeed"))
    if (cfg.data.prompt_template is None) != (cfg.data.response_template is None):
        which = "response_template" if cfg.data.prompt_template else "prompt_template"
        p.append((f"data.{which}", "prompt_template and response_template go together; set both, or neither to use text_field"))
    p += _machine_checks(cfg.distributed)
    p += _layer_split_checks(cfg)
    if cfg.training.eval_every_steps and not (cfg.data.validation_split or cfg.data.validation_path):
        p.append(("training.eval_every_steps", "evaluation needs data.validation_split > 0 or data.validation_path"))
    if cfg.data.streaming and not cfg.training.max_steps:
        p.append(("training.max_steps", "streaming data has no known length; set training.max_steps (or data.streaming: false)"))
    if cfg.data.streaming and cfg.data.validation_split:
        p.append(("data.validation_split", "a stream cannot be split; set data.validation_path, or data.streaming: false"))
    ev = cfg.evaluation
    if ev.sample_prompts and not ev.sample_every_steps and not cfg.training.eval_every_steps:
        p.append(("evaluation.sample_prompts", "samples are made at each evaluation or every N steps; set "
                  "evaluation.sample_every_steps, or training.eval_every_steps with validation data"))
    if ev.early_stopping_patience and not cfg.training.eval_every_steps:
        p.append(("evaluation.early_stopping_patience", "early stopping watches the validation loss; set "
                  "training.eval_every_steps (and data.validation_split or data.validation_path)"))
    p += _objective_checks(cfg)
    p += _ladder_keeps_check(cfg)
    p += _optimizer_in_backward_checks(cfg)
    if cfg.device == "cpu" and cfg.speed.precision == "fp16":
        p.append(("speed.precision", "fp16 mixed precision needs a GPU; use fp32 or bf16 on the CPU"))
    if cfg.device == "cpu" and placement(t.optimizer).cuda_only:
        p.append(("training.optimizer", f"{t.optimizer} is bitsandbytes' AdamW for NVIDIA GPUs (paged states live in "
                  f"CUDA managed memory, 8-bit ones are quantised by its CUDA kernels); on the CPU use {DEFAULT}"))
    return p


def _layer_split_checks(cfg) -> list[tuple[str, str]]:
    """The layers split over the cards (``distributed.layer_split``, docs/gpus.md): adapters on frozen weights,
    on one machine, without DeepSpeed, over more than one card; the per-card counts one per card."""
    d, p = cfg.distributed, []
    counts = d.layers_per_gpu
    if isinstance(counts, list) and d.layer_split is False:
        p.append(("distributed.layers_per_gpu", "counts layers per card but distributed.layer_split is false; set "
                  "distributed.layer_split: true to split the layers, or layers_per_gpu: auto"))
    if d.layer_split is not True:
        return p
    why = ("a full fine-tune (each card would update its layers' optimizer states: use DeepSpeed ZeRO-3 to shard "
           "them over the cards as ranks)" if cfg.method.type == "full" else
           f"objective {cfg.training.objective} (its sampling phase is not planned split)"
           if cfg.training.objective == "grpo" else
           f"{d.num_nodes} machines (a split runs in one process on one machine)" if d.num_nodes > 1 else
           "DeepSpeed (its engine owns the model's placement)" if cfg.deepspeed.enabled is True else
           "one card (distributed.num_gpus is 1: there is nothing to split over)" if d.num_gpus < 2 else "")
    if why:
        p.append(("distributed.layer_split", f"true splits a LoRA/QLoRA model's layers over this machine's cards, "
                  f"not with {why}; set distributed.layer_split: auto (or false)"))
    if isinstance(counts, list) and len(counts) != d.num_gpus:
        p.append(("distributed.layers_per_gpu", f"lists {len(counts)} count(s) but the layers are split over "
                  f"{d.num_gpus} card(s); list one count per card, or layers_per_gpu: auto"))
    return p


def _machine_checks(d) -> list[tuple[str, str]]:
    """Several machines (docs/multi-node.md): this machine's number within them, and where they meet. The DeepSpeed
    launcher (``auto`` picks it for several machines) reads the machines from a hostfile; torchrun needs only node 0's
    address."""
    p: list[tuple[str, str]] = []
    if d.node_rank >= d.num_nodes:
        p.append(("distributed.node_rank", f"{d.node_rank} but distributed.num_nodes is {d.num_nodes}: the machines "
                  f"are numbered 0 to {d.num_nodes - 1}; set distributed.node_rank to this machine's number "
                  "(0 on the first host of the hostfile)"))
    if d.num_nodes > 1 and not d.hostfile and (d.launcher != "torchrun" or not d.master_addr):
        p.append(("distributed.hostfile", "several machines need a hostfile ('hostname slots=N' per line, node 0 "
                  "first), or distributed.launcher: torchrun with distributed.master_addr set to node 0's address"))
    return p


def _optimizer_in_backward_checks(cfg: RunConfig) -> list[tuple[str, str]]:
    """``training.optimizer_in_backward: true`` updates each parameter the moment its gradient is complete: that
    gradient must be the whole step's (one micro-batch, one rank, no loss scale to undo) and is gone right after, so
    nothing can see every gradient at once (no global-norm clipping) and no other engine may own the step."""
    t = cfg.training
    if t.optimizer_in_backward is not True:
        return []
    fused, p = "with training.optimizer_in_backward: true", []
    off = "or set training.optimizer_in_backward: false"
    mb, ga, ranks = t.micro_batch_size, t.gradient_accumulation_steps, cfg.world_size
    if isinstance(ga, int) and ga != 1:
        p.append(("training.gradient_accumulation_steps", f"{ga}: {fused} each optimizer step is one micro-batch "
                  f"(a parameter is updated as soon as its gradient is complete, so gradients cannot add up over "
                  f"micro-batches); set training.gradient_accumulation_steps: 1 and training.micro_batch_size: "
                  f"{t.effective_batch_size // ranks} (the whole effective batch), {off}"))
    elif isinstance(mb, int) and mb * ranks != t.effective_batch_size and not t.effective_batch_size % (mb * ranks):
        p.append(("training.micro_batch_size", f"{mb} × {ranks} GPU(s) is not effective_batch_size "
                  f"{t.effective_batch_size}: {fused} each optimizer step is one micro-batch (no gradient "
                  f"accumulation); set training.micro_batch_size: {t.effective_batch_size // ranks} (or auto), {off}"))
    if t.max_grad_norm > 0:
        p.append(("training.max_grad_norm", f"{t.max_grad_norm}: clipping by the global gradient norm needs every "
                  f"gradient at once, and {fused} each parameter is updated (and its gradient freed) as soon as that "
                  f"gradient is complete; set training.max_grad_norm: 0 (no clipping), {off}"))
    p += [(field, f"{why}, {off}") for field, why in in_backward.blockers(cfg)]
    return p


def _ladder_keeps_check(cfg: RunConfig) -> list[tuple[str, str]]:
    """``recovery.ladder_keeps`` names settings that exist (a typo would keep nothing, silently)."""
    keep = cfg.recovery.ladder_keeps
    if not isinstance(keep, list):
        return []
    known = set(_dotted_keys(type(cfg)))
    bad = [k for k in keep if k not in known]
    if not bad:
        return []
    return [("recovery.ladder_keeps", f"{bad[0]!r} is not a setting; list dotted keys such as deepspeed.enabled or "
             f"training.micro_batch_size (or 'auto': the settings your config gives a value)")]


def _dotted_keys(model, prefix: str = "") -> list[str]:
    out = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and hasattr(ann, "model_fields"):
            out += _dotted_keys(ann, f"{prefix}{name}.")
        else:
            out.append(f"{prefix}{name}")
    return out


def _objective_checks(cfg: RunConfig) -> list[tuple[str, str]]:
    """Preference objectives read prompt/chosen/rejected (or KTO) records, not templates or packed text."""
    t, p = cfg.training, []
    if t.objective == "sft":
        return p
    if cfg.data.prompt_template is not None:
        fields = {"kto": "completion/label", "grpo": f"'{cfg.rewards.answer_field}' (the reference answer)"}.get(
            t.objective, "chosen/rejected")
        p.append(("data.prompt_template", f"objective {t.objective} reads 'prompt' and {fields} fields directly; "
                  "remove the templates"))
    if t.objective == "kto" and t.micro_batch_size == 1:
        p.append(("training.micro_batch_size", "KTO estimates its KL term from the other examples of a micro-batch; "
                  "use 2 or more, or auto"))
    if t.precompute_ref_log_probs and t.objective == "orpo":
        p.append(("training.precompute_ref_log_probs", "ORPO has no reference model; set it to false"))
    if t.objective == "grpo":
        p += _grpo_checks(cfg)
    return p


def _off_policy_checks(g) -> list[tuple[str, str]]:
    """Clip-higher and GSPO act on the policy ratio, which is exactly 1 while every step samples afresh (TrainPilot
    never trains a step on completions sampled before the previous step): they need num_iterations of 2 or more."""
    p = []
    if g.epsilon_high is not None and g.epsilon_high < g.epsilon:
        p.append(("grpo.epsilon_high", f"{g.epsilon_high} is below grpo.epsilon {g.epsilon}: clip-higher widens the "
                  f"upper bound; set epsilon_high ≥ epsilon (DAPO: 0.28 with epsilon 0.2), or null"))
    if g.num_iterations == 1:
        if g.epsilon_high is not None:
            p.append(("grpo.epsilon_high", "has no effect with grpo.num_iterations 1 (each step samples afresh, so "
                      "the policy ratio is exactly 1 and is never clipped); set grpo.num_iterations: 2 or more, or "
                      "remove epsilon_high"))
        if g.importance_sampling_level == "sequence":
            p.append(("grpo.importance_sampling_level", "'sequence' (GSPO) has no effect with grpo.num_iterations "
                      "1 (each step samples afresh, so every ratio is exactly 1); set grpo.num_iterations: 2 or "
                      "more, or use 'token'"))
    return p


def _grpo_checks(cfg: RunConfig) -> list[tuple[str, str]]:
    """GRPO's batch geometry (whole prompt groups) and at least one reward."""
    t, g, r, p = cfg.training, cfg.grpo, cfg.rewards, []
    n = g.num_generations
    if t.effective_batch_size % n:
        p.append(("training.effective_batch_size", f"{t.effective_batch_size} completions per step is not a whole "
                  f"number of groups of grpo.num_generations {n}; use a multiple of {n} (e.g. {n * max(1, round(t.effective_batch_size / n))})"))
    gb = g.generation_batch_size
    if isinstance(gb, int):
        per_gpu = t.effective_batch_size // cfg.world_size
        if gb % n:
            p.append(("grpo.generation_batch_size", f"{gb} is not a multiple of num_generations {n} (each sampling "
                      f"pass holds whole groups); use a multiple of {n} or auto"))
        elif per_gpu % gb:
            p.append(("grpo.generation_batch_size", f"{gb} does not divide the {per_gpu} completions each GPU trains "
                      f"on per step; use a divisor of {per_gpu} or auto"))
        elif isinstance(t.micro_batch_size, int) and gb % t.micro_batch_size:
            p.append(("grpo.generation_batch_size", f"{gb} is not a multiple of micro_batch_size {t.micro_batch_size}; "
                      f"use a multiple of it or auto"))
    p += _off_policy_checks(g)
    if g.max_completion_length >= cfg.data.seq_len:
        p.append(("grpo.max_completion_length", f"{g.max_completion_length} leaves no room for the prompt in "
                  f"data.seq_len {cfg.data.seq_len}; raise data.seq_len or lower max_completion_length"))
    if cfg.evaluation.early_stopping_patience:
        p.append(("evaluation.early_stopping_patience", "GRPO's validation loss is a policy-gradient term, not a "
                  "measure of quality (it does not fall as the model improves); early stopping on it would stop at "
                  "random: remove evaluation.early_stopping_patience"))
    if not any(getattr(r, k) > 0 for k in type(r).builtin_names()) and not r.python:
        p.append(("rewards", "GRPO needs at least one reward: give a built-in one a weight (e.g. rewards.exact_answer: "
                  "1.0) or set rewards.python to a file of reward functions"))
    return p
