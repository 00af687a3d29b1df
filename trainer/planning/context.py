"""What the planner's search and its reasons share: the context of one plan, and how a candidate
setting becomes a memory-model setup. Bytes throughout."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

from trainer.config import replace as config_replace
from trainer.config.resolved import resolve_precision
from trainer.core.errors import UserError
from trainer.data import token_stats
from trainer.models.spec import ModelSpec, spec_for_run
from trainer.planning import kernels, layer_split, loss_kernel
from trainer.planning import picture_memory as picture_costs
from trainer.planning.budget import budget_for, gpu_budget_terms, host_budget
from trainer.planning.memory import Estimate, TrainSetup


DsOption = tuple[bool, int, bool, bool]  # (enabled, zero_stage, offload_optimizer, offload_params)


@dataclass
class Context:
    """Everything the search needs, computed once per plan."""
    cfg: Any
    hardware: Any
    gpu: Any
    device: str
    goal: str
    spec: Optional[ModelSpec]
    spec_error: str
    precision: str
    budget: int
    usable: int
    held: int
    host_budget: int
    budget_terms: tuple = (0, ())  # (the memory the budget is taken from, [(what, bytes) kept out of it])
    length: token_stats.PlannedLength = None  # the sequence length memory is planned at (data.seq_len, or the data's)
    liger: Optional[bool] = None  # Liger's kernels run here (loss_kernel.liger_runs: a GPU, liger-kernel with Triton)
    loss_kernel: Optional[str] = None  # the loss this context plans (the search sets it; None: the config's)
    pictures: Optional[picture_costs.PictureLoad] = None  # what a sample's pictures bring (vision-language models)
    tiled_mlp: Optional[bool] = None  # the MLP tiled or not (the search sets it; None: the config's, auto off)
    lora_dropout: Optional[float] = None  # the adapters' dropout (the search sets it; None: the config's, auto 0.05)
    in_backward: Optional[bool] = None  # the optimizer step in backward (the search sets it; None: the config's)
    split_budgets: tuple = ()  # the layers split over cards (distributed.layer_split): each card's budget, in order

    def __post_init__(self):
        if self.length is None:
            self.length = token_stats.planned_length(self.cfg)
        if self.pictures is None:
            self.pictures = picture_costs.load_for(self.cfg, self.spec)
            if self.pictures is not None and self.cfg.data.packing and self.pictures.per_sample:
                # data with pictures is never packed (the worker's rule): its samples are as long as they are
                self.length = token_stats.planned_length(config_replace(self.cfg, **{"data.packing": False}))
        if self.liger is None:  # asked once per plan
            self.liger = loss_kernel.liger_runs(self.device)

    @property
    def seq(self) -> int:
        """Tokens per sequence the plan is made for (``data.seq_len``, or the data's longest sample when shorter)."""
        return self.length.tokens

    @classmethod
    def build(cls, cfg, hardware, gpu, device: str, goal: str) -> "Context":

        try:
            spec, err = spec_for_run(cfg), ""
        except UserError as exc:
            spec, err = None, str(exc)
        available = hardware.host.ram_available_bytes
        host, cpu_budget, cpu_terms = host_budget(available, goal)
        if device == "cuda" and gpu is not None:
            budget, usable, held = budget_for(gpu, goal)
            terms = gpu_budget_terms(gpu, goal)
        else:
            usable, held, budget, terms = host, 0, cpu_budget, (available, cpu_terms)
        return cls(cfg, hardware, gpu, device, goal, spec, err, _precision(cfg, gpu, device), budget, usable,
                   held, host, terms, split_budgets=split_budgets(cfg, hardware, spec, device, goal))


    @classmethod
    def for_resolved(cls, cfg, spec: ModelSpec) -> "Context":
        """A context for judging a resolved config without a hardware snapshot (the OOM ladder): its device and
        precision as resolved, no budget."""
        return cls(cfg, None, None, cfg.device, cfg.plan_goal, spec, "", cfg.speed.precision, 0, 0, 0, 0)


def split_budgets(cfg, hardware, spec: Optional[ModelSpec], device: str, goal: str) -> tuple:
    """The budgets of the cards the layers are split over, in ``distributed.gpus`` order (``layer_split: true`` on
    a GPU machine; empty otherwise). UserError for ``distributed.layers_per_gpu`` counts that are not the model's."""
    d = cfg.distributed
    if d.layer_split is not True or device != "cuda" or hardware is None or not isinstance(d.gpus, list):
        return ()
    cards = [hardware.card(w) for w in d.gpus]
    if any(g is None for g in cards) or len(cards) < 2:
        return ()
    counts = d.layers_per_gpu
    if spec is not None and isinstance(counts, list) and sum(counts) != spec.layers:
        raise UserError(f"distributed.layers_per_gpu: {counts} adds up to {sum(counts)} decoder layers but "
                        f"{spec.name} has {spec.layers}; list counts that add up to {spec.layers}, or "
                        "layers_per_gpu: auto", field="distributed.layers_per_gpu")
    return tuple(budget_for(g, goal)[0] for g in cards)


def _precision(cfg, gpu, device: str) -> str:
    return resolve_precision(cfg.speed.precision, device, gpu.compute_capability if gpu is not None else None)


def weights_16bit(cfg, precision: str) -> bool:
    """Parameters held in 16 bits: an explicit 16-bit model.dtype, or 'auto' under bf16."""
    if cfg.model.dtype in ("bfloat16", "float16"):
        return True
    return cfg.model.dtype == "auto" and precision == "bf16"


def family(ctx: Context) -> Optional[str]:
    """The model's family (its model_type), or None when the architecture is unknown."""
    return ctx.spec.family if ctx.spec is not None else None


def loss_of(ctx: Context) -> str:
    """The loss kernel ``ctx`` plans for (``trainer.planning.loss_kernel``): the one the search set, else the
    config's, else ``auto``'s first candidate."""
    if ctx.loss_kernel:
        return ctx.loss_kernel
    return loss_kernel.candidates(ctx.cfg, family(ctx), ctx.liger)[0]


def with_loss(ctx: Context, kernel: str) -> Context:
    """``ctx`` planning for ``kernel``."""
    return replace(ctx, loss_kernel=kernel)


def with_variant(ctx: Context, variant) -> Context:
    """``ctx`` planning for a ``kernels.Variant`` (tiled MLP, LoRA dropout)."""
    return replace(ctx, tiled_mlp=variant.tiled_mlp, lora_dropout=variant.lora_dropout)


def tiled_of(ctx: Context) -> bool:
    """Whether ``ctx`` plans the MLP tiled: the search's choice, else the config's (``auto``: off)."""
    return ctx.tiled_mlp if ctx.tiled_mlp is not None else ctx.cfg.speed.tiled_mlp is True


def dropout_of(ctx: Context) -> float:
    """The adapters' dropout ``ctx`` plans: the search's choice, else the config's (``kernels.dropout_default``)."""
    if ctx.lora_dropout is not None:
        return ctx.lora_dropout
    return kernels.dropout_default(ctx.cfg)


def make_setup(ctx: Context, micro: int, ckpt: bool, ds: DsOption, offload: Optional[bool] = None,
               optimizer: Optional[str] = None, generation: Optional[int] = None) -> TrainSetup:
    """The memory model's setup for one candidate; ``offload`` (activation offload), ``optimizer`` and GRPO's
    ``generation`` batch default to the config's values (``auto`` offload: off; ``auto`` generation batch:
    one sampling pass per optimizer step)."""
    c = ctx.cfg
    targets = c.method.target_modules
    if offload is None:
        offload = c.speed.activation_offload is True
    per = per_rank_batch(c)
    if generation is None:
        gb = c.grpo.generation_batch_size
        generation = gb if isinstance(gb, int) else per
    return TrainSetup(
        micro_batch=micro, seq_len=ctx.seq, method=c.method.type, precision=ctx.precision,
        weights_16bit=weights_16bit(c, ctx.precision), optimizer=optimizer or c.training.optimizer, checkpointing=ckpt,
        loss_kernel=loss_kernel.computed(c, loss_of(ctx)), activation_offload=offload,
        attn=attention(ctx), deepspeed=ds[0], zero_stage=ds[1], offload_optimizer=ds[2],
        offload_params=ds[3], overlap_comm=c.deepspeed.overlap_comm, gpus_per_node=c.distributed.ranks_per_node,
        num_nodes=c.distributed.num_nodes, lora_r=c.method.lora_r, lora_dropout=dropout_of(ctx),
        lora_targets=(targets,) if isinstance(targets, str) else tuple(targets),
        lora_experts=bool(getattr(c.method, "lora_experts", False)), device=ctx.device,
        objective=c.training.objective, precompute_ref=c.training.precompute_ref_log_probs,
        gradient_accumulation=max(1, per // micro), num_generations=c.grpo.num_generations,
        max_completion_length=c.grpo.max_completion_length, generation_batch=generation, beta=c.grpo.beta,
        num_iterations=c.grpo.num_iterations, triton_kernels=triton_kernels(ctx), tiled_mlp=tiled_of(ctx),
        autocast=ctx.precision in ("bf16", "fp16"), expandable_segments=expandable_segments(ctx),
        packed_mask=masked_attention(ctx, micro), in_backward=in_backward_of(ctx), paged_on_gpu=windows(ctx),
        split_over=ctx.split_budgets,
        split_layers=tuple(c.distributed.layers_per_gpu) if isinstance(c.distributed.layers_per_gpu, list) else (),
        **picture_fields(ctx))


def in_backward_of(ctx: Context) -> bool:
    """Whether ``ctx`` plans the optimizer step fused into backward: the search's choice, else the config's
    (``training.optimizer_in_backward``; None: off)."""
    return ctx.in_backward if ctx.in_backward is not None else ctx.cfg.training.optimizer_in_backward is True


def windows(ctx: Context) -> bool:
    """The recording was made on Windows, where CUDA managed memory cannot oversubscribe the GPU (the CUDA C++
    Programming Guide, unified memory on Windows): paged optimizer states are planned on the GPU there."""
    return getattr(getattr(ctx.hardware, "host", None), "platform", None) == "Windows"


def picture_fields(ctx: Context) -> dict:
    """The TrainSetup fields of the pictures a sample brings (none for a text run)."""
    load = ctx.pictures
    if load is None:
        return {}
    # a sequence is cut before the first picture that does not fit it whole (the worker's rule): only those that fit
    # reach the vision tower
    fit = min(load.per_sample, ctx.seq // max(1, load.picture.tokens))
    return {"train_vision": ctx.cfg.method.train_vision, "pictures": fit,
            "picture_units": load.picture.units, "picture_positions": load.picture.positions}


def expandable_segments(ctx: Context) -> bool:
    """The worker's CUDA allocator runs with expandable segments (``launch`` sets PYTORCH_CUDA_ALLOC_CONF for CUDA
    workers on Linux, where PyTorch has them; a recording without a platform is taken as Linux)."""
    platform = getattr(getattr(ctx.hardware, "host", None), "platform", None)
    return ctx.device == "cuda" and platform in (None, "Linux")


def masked_attention(ctx: Context, micro: int) -> bool:
    """Supervised batches whose attention needs a full mask (``planning.packed_mask``): packed blocks (documents
    kept apart), or unpacked micro-batches of several sequences (padded to the longest). One unpacked sequence per
    micro-batch needs none (causal attention alone). Data with pictures is never packed (the worker's rule), whatever
    ``data.packing`` says. Other objectives' padding is not planned as a mask."""
    cfg = ctx.cfg
    packed = cfg.data.packing and ctx.pictures is None
    return cfg.training.objective == "sft" and (packed or micro > 1)


def triton_kernels(ctx: Context) -> bool:
    """Triton kernels load in the worker and hold device memory (``saver_memory.runtime_bytes``): Liger's, or
    inductor's under ``speed.torch_compile`` (CUDA). The chunked loss's one compiled per-chunk kernel is not counted
    as such: the 1.1 GiB was measured with Liger's set of kernels, and one small kernel's share is not measured yet
    (``KERNELS_MARGIN`` stands for it)."""
    if ctx.device != "cuda":
        return False
    loss = loss_kernel.computed(ctx.cfg, loss_of(ctx))
    return loss == loss_kernel.LIGER or bool(ctx.cfg.speed.torch_compile)


def attention(ctx: Context) -> str:
    """The attention kernel memory is estimated for: transformers runs Gemma 2 only with eager
    attention (its soft-capped scores), and an architecture without SDPA support (gpt-oss: attention sinks)
    with eager too, whatever the config asks."""
    sdpa = ctx.cfg.model.attn_implementation == "sdpa"
    if ctx.spec is not None and sdpa and (ctx.spec.family == "gemma2" or not ctx.spec.supports_sdpa):
        return "eager"
    return ctx.cfg.model.attn_implementation


def need(ctx: Context, est: Estimate) -> int:
    """The bytes that must fit the budget: GPU peak, or host RAM on the CPU. The layers split over cards: the
    budget less the least room a card keeps (so it fits ``ctx.budget`` exactly when every card fits its own)."""
    if est.cards and ctx.device == "cuda":
        fullest = layer_split.fullest(est.cards)
        return ctx.budget - (fullest["budget_bytes"] - fullest["peak_bytes"])
    return est.peak_bytes if ctx.device == "cuda" else est.host_ram_bytes


def fits(ctx: Context, est: Estimate, budget: Optional[int] = None) -> bool:
    budget = ctx.budget if budget is None else budget
    host_ok = ctx.device == "cpu" or est.host_ram_bytes <= ctx.host_budget
    return need(ctx, est) <= budget and host_ok


def per_rank_batch(cfg) -> int:
    t, ranks = cfg.training, cfg.world_size
    if t.effective_batch_size % ranks:
        raise UserError(f"training.effective_batch_size {t.effective_batch_size} is not divisible by {ranks} GPU(s); "
                        f"use a multiple of {ranks}", field="training.effective_batch_size")
    return t.effective_batch_size // ranks


def micro_options(cfg) -> list[int]:
    per = per_rank_batch(cfg)
    mb, ga = cfg.training.micro_batch_size, cfg.training.gradient_accumulation_steps
    if isinstance(mb, int):
        return [mb]
    if isinstance(ga, int):
        return [max(1, per // ga)]
    floor = 2 if cfg.training.objective == "kto" and per >= 2 else 1  # KTO's KL term needs 2 per micro-batch
    out = [d for d in range(per, 0, -1) if per % d == 0 and d >= floor]
    if cfg.training.objective == "grpo":  # a micro-batch must divide some whole-group generation batch
        out = [d for d in out if any(g % d == 0 for g in generation_options(cfg, d))] or out
    return out


def generation_options(cfg, micro: int) -> list[int]:
    """GRPO's generation batches for this micro-batch, largest first: multiples of num_generations (whole
    groups) and of the micro-batch (TRL's steps_per_generation is generation / micro) that divide the
    completions each GPU trains on per step (generation stays aligned to optimizer steps). An explicit value
    is the only option (judged, never changed); other objectives have none."""
    if cfg.training.objective != "grpo":
        return [0]
    gb = cfg.grpo.generation_batch_size
    return [gb] if isinstance(gb, int) else generation_candidates(cfg, micro)


def generation_candidates(cfg, micro: int) -> list[int]:
    """Every valid generation batch for this micro-batch, largest first, whatever the config sets (one pass per
    step when no whole-group batch divides the step: TRL's default)."""
    per, n = per_rank_batch(cfg), cfg.grpo.num_generations
    return [g for g in range(per, 0, -1) if per % g == 0 and g % n == 0 and g % micro == 0] or [per]
