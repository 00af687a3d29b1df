"""The setup the planner computes with: one training configuration as the memory and time formulas see it (counts
and dtype names), and the widths every formula reads from it (bytes per element), so no formula re-derives them.
No torch."""
from __future__ import annotations

from dataclasses import dataclass, fields

from trainer.config.placements import DEFAULT, placement
from trainer.models.spec import ModelSpec
from trainer.planning.tiled_memory import tiles_mlp


@dataclass(frozen=True)
class TrainSetup:
    """What memory and compute depend on. Sizes are counts; dtypes are names; widths are bytes per element."""

    micro_batch: int = 1
    seq_len: int = 2048
    method: str = "full"  # full | lora | qlora
    precision: str = "bf16"  # bf16 | fp16 | fp32 (autocast/compute dtype)
    weights_16bit: bool = True  # parameters held in 16 bits (pure bf16); False: fp32 master weights
    optimizer: str = DEFAULT  # where AdamW's states live: a name of config.placements' table
    in_backward: bool = False  # the optimizer step runs in backward (training.optimizer_in_backward): no gradient buffer
    paged_on_gpu: bool = False  # managed memory cannot oversubscribe the GPU here (Windows): paged states stay on it
    checkpointing: bool = False
    loss_kernel: str = "hf"  # hf | chunked | liger (planning/loss_kernel.py); the last two never hold full logits
    activation_offload: bool = False  # saved activations in pinned host RAM (TRL's activation offloading)
    attn: str = "sdpa"  # sdpa | eager | flash_attention_2
    deepspeed: bool = False
    zero_stage: int = 2
    offload_optimizer: bool = False
    offload_params: bool = False
    overlap_comm: bool = False
    gpus_per_node: int = 1
    num_nodes: int = 1
    lora_r: int = 16
    lora_dropout: float = 0.05
    lora_targets: tuple[str, ...] = ("all-linear",)
    lora_experts: bool = False  # LoRA on the fused expert parameters too (PEFT's target_parameters)
    device: str = "cuda"  # cuda | cpu
    objective: str = "sft"  # sft | dpo | kto | orpo | grpo
    precompute_ref: bool = False  # DPO/KTO: reference log-probs scored once before training (no reference copy)
    gradient_accumulation: int = 1  # micro-batches per optimizer step (GRPO: whether sampling runs mid-step)
    num_generations: int = 8  # GRPO: completions per prompt
    max_completion_length: int = 256  # GRPO: longest completion (tokens); prompts get seq_len minus this
    generation_batch: int = 0  # GRPO: completions sampled at once per GPU (0: micro × accumulation)
    beta: float = 0.0  # GRPO: KL coefficient; > 0 scores a reference (a frozen copy for a full fine-tune)
    triton_kernels: bool = False  # Triton kernels load (Liger's, or torch.compile's): their modules hold device memory
    num_iterations: int = 1  # GRPO: optimizer steps per sampling pass; > 1 scores the old policy's log-probs
    train_vision: str = "none"  # none | projector | all: which vision parts train (planning/picture_memory.py)
    pictures: int = 0  # pictures in the sample with the most (0: text only)
    picture_units: int = 1  # vision units per picture (Idefics3's tiles; else 1)
    picture_positions: int = 0  # positions the vision tower runs over per unit
    packed_mask: bool = False  # packed blocks of several documents: attention keeps a block mask (planning/packed_mask.py)
    tiled_mlp: bool = False  # each layer's MLP over tiles of the sequence (speed.tiled_mlp): its input kept, not its intermediates
    autocast: bool = False  # the forward runs under torch.autocast (HF's Trainer, 16-bit precision): adapters' saved inputs
    expandable_segments: bool = False  # PyTorch's allocator maps pages into growing segments (the worker sets it on CUDA)
    split_over: tuple[int, ...] = ()  # the budgets of the cards the layers are split over, in order (planning/layer_split)
    split_layers: tuple[int, ...] = ()  # decoder layers per card where the config sets them (empty: the planner's)

    def but(self, **changes) -> "TrainSetup":
        """This setup with ``changes`` (field names): ``dataclasses.replace`` without running ``__init__`` again (a
        search makes ~200,000 of these; replace's keyword init took a sixth of a plan's time)."""
        unknown = set(changes) - _FIELDS
        if unknown:
            raise TypeError(f"TrainSetup has no field {sorted(unknown)}")
        new = object.__new__(TrainSetup)
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new

    @property
    def world(self) -> int:
        return self.gpus_per_node * self.num_nodes

    @property
    def sequences_per_sample(self) -> int:
        """Sequences one sample puts through the model with gradients: a DPO/ORPO pair is chosen + rejected."""
        return 2 if self.objective in ("dpo", "orpo") else 1

    @property
    def liger(self) -> bool:
        """Liger's kernels replace the loss, RMSNorm, RoPE and SwiGLU (``loss_kernel`` liger: planning/loss_kernel.py)."""
        return self.loss_kernel == "liger" and self.objective == "sft"

    @property
    def full_logits(self) -> bool:
        """The loss holds the whole micro-batch's logits (HF's supervised loss)."""
        return self.loss_kernel == "hf" or self.objective != "sft"

    @property
    def fused_head(self) -> bool:
        """TRL's DPO/KTO/GRPO score log-probabilities in chunks (no full logits kept): see trl add_fused_lm_head."""
        return self.objective in ("dpo", "kto", "grpo")

    @property
    def activation_width(self) -> int:
        """Bytes per element of what the forward computes and autograd keeps (the compute dtype): 4 when training
        in fp32, else 2 (bf16 or fp16, autocast included)."""
        return 4 if self.precision == "fp32" else 2

    @property
    def weight_width(self) -> int:
        """Bytes per parameter of the weights as held: 2 for 16-bit weights (``weights_16bit``: pure bf16), 4 for
        fp32 ones (training in fp32, or fp32 master weights under autocast). fp32 precision wins over
        ``weights_16bit``; the planner never builds that pair (``context.weights_16bit``: bf16 only)."""
        return 2 if self.weights_16bit and self.precision != "fp32" else 4

    @property
    def stream_width(self) -> int:
        """Bytes per element of the residual stream between decoder layers (what a checkpointed layer keeps as
        its input): 4 when training in fp32, or in a full fine-tune over fp32 weights under autocast; else 2."""
        return 4 if self.precision == "fp32" or (not self.weights_16bit and self.method == "full") else 2

    @property
    def paged_to_host(self) -> bool:
        """Optimizer states in CUDA managed memory planned in host RAM (bitsandbytes' paged AdamW, where the driver
        can page them out: Linux; on Windows managed memory cannot oversubscribe the GPU, ``paged_on_gpu``)."""
        return placement(self.optimizer).paged and not self.paged_on_gpu and self.device == "cuda"

    def mlp_tiled(self, spec: ModelSpec) -> bool:
        """Whether the memory formulas plan the MLP tiled here ("tiled here"): asked for (``tiled_mlp``) and
        plannable tiled for this model and setup (``tiled_memory.tiles_mlp``: the layouts they were measured on).
        Elsewhere a tiled run is planned untiled (more memory); its compute counts the tiles wherever the worker
        tiles (``flops.flops_per_token`` reads ``tiled_mlp``)."""
        return self.tiled_mlp and tiles_mlp(spec, self)


_FIELDS = frozenset(f.name for f in fields(TrainSetup))
