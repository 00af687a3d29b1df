"""The run config's sections: one typed pydantic model per section and ``RunConfig`` over them.

The YAML presets, the CLI's ``--set`` overrides, the GUI's advanced form and the README's config
reference are all derived from these models; nothing restates a default elsewhere. Checks that span
fields live in ``cross_checks``; reading, overrides and error messages in ``loading`` and ``messages``.
Light module: pydantic only (the GUI imports it).
"""
from __future__ import annotations

import re
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from trainer.config import placements
from trainer.config.cross_checks import CrossCheckError, cross_check

SCHEMA_VERSION = 1
Auto = Literal["auto"]
# Marks a field whose "auto" means "detected from the input when it is used" (a file's type from its
# name, records' shape from their fields), not a choice for this machine: the planner leaves it as is.
DETECTED = {"auto": "detected when used"}
# Marks a field only one objective reads: the planner resolves its "auto" for runs of that objective and leaves it
# for the others (so resolved configs of other runs, and run folders made before the field existed, stay valid).
PLANNED_FOR_GRPO = {"auto": "planned for GRPO runs"}
# Marks the field whose "auto" is the user's own settings, resolved when a run is created (the planner writes the list
# into the run folder's config.yaml); a run folder made before the field existed keeps "auto".
YOUR_SETTINGS = {"auto": "the settings your config gives a value"}
# Marks the field whose "auto" is the planner's choice of GPUs: a run folder (or a hand-made resolved config) that
# leaves it "auto" shows its worker every card, as runs did before the field existed.
PLANNED_GPUS = {"auto": "the planner picks the cards"}
# Marks the fields whose "auto" is the planner's split of the layers over the cards: a run folder (or a hand-made
# resolved config) that leaves layer_split "auto" trains data-parallel, as runs did before the field existed, and one
# that splits with layers_per_gpu "auto" gives each card an equal share of the layers.
PLANNED_SPLIT = {"auto": "the planner splits the layers over the cards, or not"}
# Marks a weight of a built-in GRPO reward (``rewards.<name>``): the reward names are read off these fields.
REWARD_WEIGHT = {"reward": "built-in reward weight"}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(_Section):
    """Which model to train and how to load it."""
    source: str = Field(
        "demo-tiny-llama",
        description="Hugging Face hub id (e.g. meta-llama/Llama-3.2-1B) or a local folder with config.json "
        "and weights. 'demo-tiny-llama' is the bundled demo model.",
    )
    architecture: Optional[str] = Field(
        None,
        description="Build the model with random weights from this architecture: a config.json path or a name "
        "in trainer/resources/models/ (e.g. tiny-llama, llama-3.2-1b). Overrides loading weights from 'source'.",
    )
    tokenizer: Optional[str] = Field(
        None, description="Tokenizer hub id or folder; defaults to 'source'. 'demo' trains the bundled one; 'corpus' "
        "trains a BPE tokenizer on the training data (model.tokenizer_vocab_size)."
    )
    revision: Optional[str] = Field(None, description="Hub revision (branch, tag or commit).")
    tokenizer_vocab_size: Optional[int] = Field(
        None, ge=300, description="Vocabulary size when model.tokenizer is 'corpus' (a BPE tokenizer trained on the "
        "training data, cached, saved into the run and final/); null: 8192. Any other tokenizer has its own."
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="Dtype the weights are loaded in; 'auto' follows speed.precision."
    )
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = Field(
        "sdpa", description="Attention kernel. sdpa is fast and needs no extra install; eager stores s^2 scores."
    )
    trust_remote_code: bool = Field(False, description="Allow model code from the hub (only for models you trust).")
    hub_token_env: str = Field(
        "HF_TOKEN",
        description="Name of the environment variable holding a hub token (the token itself is never stored; "
        "the OS keyring entry 'trainpilot/<this name>' is used when the variable is unset).",
    )


class DataConfig(_Section):
    """Training data and how it becomes token sequences."""
    path: str = Field("demo", description="Dataset file (.jsonl .json .txt .csv .parquet); 'demo' is the bundled sample.")
    format: Literal["auto", "jsonl", "json", "txt", "csv", "parquet"] = Field(
        "auto", description="File format; 'auto' uses the file extension.", json_schema_extra=DETECTED
    )
    text_field: str = Field("text", description="Record field holding the text (when no template is set).")
    prompt_template: Optional[str] = Field(
        None,
        description="Prompt built from record fields, e.g. '### Question:\\n{question}\\n### Answer:\\n'. "
        "With response_template, prompt tokens are masked from the loss unless train_on_prompt.",
    )
    response_template: Optional[str] = Field(None, description="Response built from record fields, e.g. '{answer}'.")
    train_on_prompt: bool = Field(False, description="Also compute the loss on prompt tokens.")
    seq_len: int = Field(2048, gt=0, description="Maximum tokens per sequence (samples are cut or packed to this).")
    packing: bool = Field(
        True, description="Concatenate samples into full seq_len blocks (fastest); false pads each batch to its longest."
    )
    validation_split: float = Field(0.0, ge=0.0, lt=1.0, description="Fraction of records held out for evaluation.")
    validation_path: Optional[str] = Field(None, description="Separate validation file (instead of a split).")
    skip_bad_lines: bool = Field(False, description="Skip unparseable JSONL lines (counted and reported) instead of stopping.")
    shuffle: bool = Field(True, description="Shuffle the records before packing, and the packed sequences every later "
                          "epoch (seeded by training.seed, so resume is exact).")
    num_workers: int = Field(0, ge=0, description="DataLoader worker processes.")
    record_format: Literal["auto", "text", "template", "alpaca", "prompt_completion", "prompt_response", "chat",
                           "sharegpt", "preference", "kto"] = Field(
        "auto", description="Shape of the records (not the file type): 'auto' detects it from the fields "
        "(messages → chat, conversations → sharegpt, instruction/output → alpaca, prompt/response, question/answer, "
        "input/output → prompt_response, ...). See docs/data.md.",
        json_schema_extra=DETECTED,
    )
    chat_template: Optional[str] = Field(
        None, description="Jinja chat template (text, or a .jinja file) used instead of the tokenizer's; a tokenizer "
        "without one gets TrainPilot's default. Saved with the trained model."
    )
    system_message: Literal["auto", "merge", "drop", "error"] = Field(
        "auto", description="System messages in conversations: 'auto' keeps them where the chat template has a "
        "system role and puts their text at the start of the first user turn where it has none (Gemma); 'merge' "
        "always does that; 'drop' removes them; 'error' stops at the first one the template cannot take.",
        json_schema_extra=DETECTED,
    )
    chat_date: Optional[str] = Field(
        None, description="The date (YYYY-MM-DD) a chat template that prints today's date renders (Llama 3.x's "
        "strftime_now, Granite's \"Today's Date\"); null: the day the run is created, written into the run's "
        "config.yaml, so training, chat and an export (its Modelfile says so) render the same date."
    )
    hub_dataset: Optional[str] = Field(
        None, description="Hugging Face hub dataset id (or a local dataset folder) loaded through 'datasets' and its "
        "cache instead of data.path; the token comes from model.hub_token_env."
    )
    hub_subset: Optional[str] = Field(None, description="Hub dataset configuration (subset) name.")
    hub_split: str = Field("train", description="Hub dataset split to train on.")
    hub_revision: Optional[str] = Field(None, description="Hub dataset revision (branch, tag or commit).")
    streaming: bool = Field(
        False, description="Stream the data (constant memory, nothing cached) for corpora too big to cache; "
        "needs training.max_steps; resume skips exactly the samples already trained on."
    )
    cache: bool = Field(True, description="Keep the tokenized, packed data (keyed by data, tokenizer, template, "
                        "seq_len, packing, masking, order) for the next run and every resume; false tokenizes into a "
                        "temporary folder.")
    image_max_pixels: Optional[int] = Field(
        None, gt=0, description="Vision-language data: the most pixels a picture keeps (width × height; larger pictures "
        "are resized down, keeping their aspect), mapped onto the model's processor (max_pixels, longest edge or "
        "tiling). Fewer pixels, fewer image tokens, less memory; null keeps the processor's own setting."
    )
    num_proc: int = Field(0, ge=0, description="Tokenizing processes for files from 8 MiB (each takes every n-th "
                          "chunk); 0 means 1 (the tokenizer's threads already use every core).")



    @field_validator("chat_date")
    @classmethod
    def _a_date(cls, value):
        if value is not None and not re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(value)):
            raise ValueError(f"'{value}' is not a date; write it as YYYY-MM-DD (e.g. 2026-11-25), or null for the day "
                             f"the run is created")
        return value


class MethodConfig(_Section):
    """Full fine-tune or adapters."""
    type: Literal["full", "lora", "qlora"] = Field(
        "full", description="full trains every weight; lora trains low-rank adapters; qlora adds 4-bit base weights (CUDA)."
    )
    lora_r: int = Field(16, gt=0, description="Adapter rank.")
    lora_alpha: int = Field(32, gt=0, description="Adapter scaling (alpha / r multiplies the update).")
    lora_dropout: Union[float, Auto] = Field(
        "auto", description="Dropout on adapter inputs (0 to under 1). 'auto': 0.05, or 0 where the planner finds "
        "that dropout's copy of every adapted input is what keeps a long sequence from fitting (or needs a slower "
        "memory saver); method.lora_experts takes 0 (the plan says why)."
    )
    target_modules: Union[list[str], Literal["all-linear"]] = Field(
        "all-linear", description="Modules that get adapters: 'all-linear' or names like [q_proj, v_proj]."
    )
    lora_experts: bool = Field(
        False, description="Mixture-of-experts models (Qwen3-MoE, gpt-oss...): also adapt the experts' fused weights "
        "(PEFT's target_parameters; needs lora_dropout: 0). Off: LoRA adapts attention and dense layers, the experts "
        "stay frozen."
    )
    train_vision: Literal["none", "projector", "all"] = Field(
        "none", description="Vision-language models: which vision parts train beside the language model. 'none' "
        "keeps the vision tower and its projector frozen; 'projector' trains the projector (the connector from image "
        "features to the language model); 'all' also trains the vision tower."
    )

    @field_validator("lora_dropout")
    @classmethod
    def _a_probability(cls, value):
        if value != "auto" and not 0.0 <= value < 1.0:
            raise ValueError(f"{value} is not a dropout probability; use a number from 0 up to (not including) 1, or "
                             f"'auto'")
        return value


class TrainingConfig(_Section):
    """Optimisation and batch geometry. effective_batch = micro_batch × accumulation × GPUs, exactly."""
    max_steps: Optional[int] = Field(100, gt=0, description="Optimizer steps to train; null trains for 'epochs'.")
    epochs: float = Field(1.0, gt=0, description="Passes over the data when max_steps is null.")
    effective_batch_size: int = Field(16, gt=0, description="Samples per optimizer step across all GPUs (kept exact).")
    micro_batch_size: Union[int, Auto] = Field(
        "auto", description="Samples per forward pass per GPU; 'auto' lets the planner choose the largest that fits."
    )
    gradient_accumulation_steps: Union[int, Auto] = Field(
        "auto", description="Micro-batches per optimizer step; 'auto' derives it from the effective batch."
    )
    learning_rate: float = Field(2e-4, gt=0, description="Peak learning rate.")
    lr_scheduler: Literal["cosine", "linear", "constant", "constant_with_warmup"] = Field(
        "cosine", description="Learning-rate schedule after warmup."
    )
    warmup_steps: int = Field(0, ge=0, description="Linear warmup, in optimizer steps.")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, ge=0.0, description="Gradient clipping norm (0 disables).")
    optimizer: Literal[placements.NAMES] = Field(placements.DEFAULT, description=placements.description())
    optimizer_in_backward: Optional[bool] = Field(
        None, description="Fuse the optimizer step into the backward pass: each parameter is updated as soon as its "
        "gradient is complete, and that gradient is freed at once, so no full set of gradients is ever held. The same "
        "update as a separate step, one learning-rate schedule; it needs one micro-batch per optimizer step "
        "(gradient_accumulation_steps: 1), no gradient clipping (max_grad_norm: 0), one GPU, no DeepSpeed and no fp16 "
        "loss scaling. null: the planner decides (on for a full fine-tune that does not fit with the separate step, "
        "writing those values; docs/planner.md)."
    )
    seed: int = Field(42, description="Seed for weights init, data order and dropout.")
    eval_every_steps: Optional[int] = Field(None, gt=0, description="Evaluate every N steps (needs validation data).")
    objective: Literal["sft", "dpo", "kto", "orpo", "grpo"] = Field(
        "sft", description="What is learned: sft (next-token loss on text), dpo or orpo (preference pairs: prompt, "
        "chosen, rejected), kto (prompt, completion, label true/false), grpo (prompts and reference answers: the "
        "model samples grpo.num_generations answers per prompt, scored by the rewards section). A preference pair "
        "counts as one sample; under grpo a sample is one sampled completion."
    )
    dpo_beta: float = Field(0.1, gt=0, description="β of DPO and KTO: how far the model may move from the reference "
                            "(smaller moves further); ORPO uses it as the weight λ of its odds-ratio term.")
    dpo_loss_type: Literal["sigmoid", "hinge", "ipo", "robust", "bco_pair", "apo_zero", "apo_down", "sigmoid_norm"] = Field(
        "sigmoid", description="DPO loss: sigmoid is the paper's; ipo, hinge, robust and the others are TRL's variants."
    )
    precompute_ref_log_probs: bool = Field(
        False, description="DPO/KTO full fine-tune: score the data with the reference model once before training, "
        "so no frozen copy of the model is kept in memory (LoRA needs no copy either way: adapters off)."
    )
    kto_desirable_weight: float = Field(1.0, gt=0, description="KTO: loss weight of desirable (label true) examples.")
    kto_undesirable_weight: float = Field(1.0, gt=0, description="KTO: loss weight of undesirable (label false) examples.")

    @field_validator("micro_batch_size", "gradient_accumulation_steps")
    @classmethod
    def _positive(cls, v):
        if isinstance(v, int) and v <= 0:
            raise ValueError("must be a positive integer or 'auto'")
        return v


class GrpoConfig(_Section):
    """GRPO (training.objective: grpo): sample several answers per prompt, score them, move toward the better ones.

    Batches count completions: effective_batch_size completions per optimizer step are
    effective_batch_size / num_generations prompts, each answered num_generations times."""
    num_generations: int = Field(8, ge=2, description="Completions sampled per prompt (the group whose rewards are "
                                 "compared); effective_batch_size must be a multiple of it.")
    max_completion_length: int = Field(256, gt=0, description="Longest sampled completion, in tokens. Prompt + "
                                       "completion must fit in data.seq_len.")
    generation_batch_size: Union[int, Auto] = Field(
        "auto", description="Completions sampled at once per GPU (a multiple of num_generations and of "
        "micro_batch_size that divides the step's completions per GPU); their KV cache is what sampling adds to "
        "memory. 'auto' lets the planner choose the largest that fits.", json_schema_extra=PLANNED_FOR_GRPO
    )
    temperature: float = Field(1.0, gt=0, description="Sampling temperature (higher: more varied answers).")
    top_p: float = Field(1.0, gt=0, le=1.0, description="Nucleus sampling: keep the smallest set of tokens whose "
                         "probability reaches top_p (1.0: all).")
    top_k: int = Field(0, ge=0, description="Sample among the k most likely tokens (0: all).")
    beta: float = Field(0.0, ge=0.0, description="KL coefficient against the starting model. 0 keeps no reference "
                        "(less memory, TRL's default); DeepSeek-R1 used 0.001. A full fine-tune with beta > 0 keeps a "
                        "frozen copy; LoRA scores the reference with the adapters off.")
    epsilon: float = Field(0.2, gt=0, description="Clipping range of the policy ratio (the lower bound, and the "
                           "upper one unless epsilon_high is set).")
    epsilon_high: Optional[float] = Field(
        None, gt=0, description="Upper clipping bound of the policy ratio when it differs from epsilon: DAPO's "
        "clip-higher (0.28 with epsilon 0.2) lets unlikely tokens gain probability faster, against entropy "
        "collapse. Clipping acts only once the policy moved since sampling: needs num_iterations of 2 or more."
    )
    importance_sampling_level: Literal["token", "sequence"] = Field(
        "token", description="The policy ratio per token (GRPO), or per completion: the mean of its tokens' "
        "log-ratios (GSPO; its paper used loss_type grpo, epsilon 3e-4, epsilon_high 4e-4). The ratio departs "
        "from 1 only once the policy moved since sampling: needs num_iterations of 2 or more."
    )
    num_iterations: int = Field(
        1, ge=1, description="Optimizer steps trained on each sampling pass (TRL's μ): from the second on, the "
        "policy differs from the one that sampled, so the ratio, its clipping and GSPO act. Each pass also scores "
        "the sampled completions once without gradients (the old policy's log-probabilities)."
    )
    loss_type: Literal["dapo", "grpo", "dr_grpo", "bnpo"] = Field(
        "dapo", description="How token losses are averaged: dapo (TRL's default, over the step's tokens), grpo (per "
        "sequence; favours short right answers), dr_grpo (by a constant), bnpo (over the micro-batch's tokens)."
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="Divide advantages by the reward spread of each group (group), of the whole batch "
        "(batch), or not at all (none: Dr. GRPO)."
    )
    mask_truncated_completions: bool = Field(
        False, description="Leave completions cut at max_completion_length out of the loss (DAPO's advice)."
    )
    system_prompt: Optional[str] = Field(
        None, description="System message put before every prompt when the model has a chat template (e.g. the "
        "answer format the rewards check)."
    )
    use_vllm: bool = Field(False, description="Sample with vLLM (colocated) instead of transformers' generate; only "
                           "where vLLM is installed.")
    samples_per_step: int = Field(2, ge=0, description="Sampled completions (with their rewards) written to the run's "
                                  "events each step for the Samples tab.")
    no_signal_steps: int = Field(5, gt=0, description="Warn when, this many steps in a row, almost every group "
                                 "(95%) scored all its answers the same: no learning signal.")


class RewardsConfig(_Section):
    """GRPO rewards: built-in ones weighted here (0 turns one off), and your own in a Python file."""
    answer_field: str = Field("answer", description="Record field holding the reference answer (GSM8K's '#### n' "
                              "answers are read as n).")
    answer_pattern: Optional[str] = Field(
        None, description="Regex whose first group extracts the final answer from a completion; default: the text "
        "inside <answer>...</answer>, else after '####', else the last number (numeric) or the whole text."
    )
    exact_answer: float = Field(0.0, ge=0.0, json_schema_extra=REWARD_WEIGHT, description="Weight of the exact-match "
                                "reward: 1 when the extracted answer equals the reference (whitespace and case "
                                "ignored), else 0.")
    numeric_answer: float = Field(0.0, ge=0.0, json_schema_extra=REWARD_WEIGHT, description="Weight of the numeric "
                                  "reward: 1 when the extracted answer is a number within numeric_tolerance of the "
                                  "reference, else 0.")
    numeric_tolerance: float = Field(1e-6, ge=0.0, description="Allowed relative difference for numeric_answer.")
    format: float = Field(0.0, ge=0.0, json_schema_extra=REWARD_WEIGHT, description="Weight of the format reward: 1 "
                          "when the completion matches format_pattern, else 0.")
    format_pattern: str = Field(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$",
                                description="Regex (DOTALL) the whole completion must match for the format reward.")
    json_valid: float = Field(0.0, ge=0.0, json_schema_extra=REWARD_WEIGHT, description="Weight of the JSON reward: "
                              "1 when the completion (or its extracted answer) parses as JSON, else 0.")
    length_penalty: float = Field(0.0, ge=0.0, json_schema_extra=REWARD_WEIGHT, description="Weight of the length "
                                  "penalty: 0 up to length_target tokens, falling linearly to -1 at "
                                  "max_completion_length.")
    length_target: int = Field(128, gt=0, description="Completion length (tokens) the length penalty starts at.")
    python: Optional[str] = Field(
        None, description="A .py file of reward functions with TRL's signature "
        "f(prompts, completions, **kwargs) -> list[float] (record fields arrive as keyword lists); every public "
        "function defined in it is used. Checked before the run starts; it runs on your machine, in the worker."
    )
    python_weights: dict[str, float] = Field(
        default_factory=dict, description="Weights of the Python file's functions by name (default 1.0 each)."
    )

    @classmethod
    def builtin_names(cls) -> tuple[str, ...]:
        """The built-in rewards' names, in schema order: the fields marked REWARD_WEIGHT (each one's weight)."""
        return tuple(k for k, f in cls.model_fields.items() if f.json_schema_extra == REWARD_WEIGHT)


class SpeedConfig(_Section):
    """Precision and kernels."""
    precision: Literal["auto", "bf16", "fp16", "fp32"] = Field(
        "auto", description="Mixed precision; 'auto' is bf16 on GPUs that support it, fp16 on older GPUs, fp32 on CPU."
    )
    tf32: bool = Field(True, description="TensorFloat-32 matmuls on Ampere and newer (ignored elsewhere).")
    fused_adamw: bool = Field(True, description="Fused AdamW kernel on CUDA (one kernel per step, not per tensor).")
    torch_compile: bool = Field(False, description="torch.compile the model (slow first steps, faster after).")
    gradient_checkpointing: Union[bool, Auto] = Field(
        "auto", description="Recompute activations in backward to save memory; 'auto' lets the planner decide."
    )
    loss_kernel: Literal["auto", "liger", "chunked", "hf"] = Field(
        "auto", description="The supervised loss. 'liger': Liger's fused linear cross-entropy with its RMSNorm, RoPE "
        "and SwiGLU kernels (NVIDIA GPU, liger-kernel installed, a family Liger supports); 'chunked': TrainPilot's "
        "chunked loss, never the full tokens × vocabulary logits (any device, same loss and gradients); 'hf': "
        "transformers' own loss. 'auto': Liger where it runs and is exact (not with torch_compile or ZeRO-3), else "
        "HF's loss wherever it fits, the chunked loss where it lets the run fit or run faster (the plan says why). "
        "Replaces speed.chunked_loss (true reads as 'chunked', false as 'hf')."
    )
    activation_offload: Union[bool, Auto] = Field(
        "auto", description="Keep activations in pinned host RAM between forward and backward (CUDA only): with "
        "gradient checkpointing, each layer's checkpointed input (copied out as the layer runs, brought back for its "
        "recompute); without, every saved activation (TRL's activation offloading). Costs host RAM and PCIe time; "
        "'auto' lets the planner decide."
    )
    tiled_mlp: Union[bool, Auto] = Field(
        "auto", description="Compute each layer's MLP and norms over tiles of the sequence, in forward and in the "
        "recompute, so their intermediates (several times the hidden size per token) never exist for the whole "
        "sequence at once; the same loss and gradients, one more MLP forward per layer. 'auto': on only where the run "
        "does not fit otherwise, or needs it to avoid a slower memory saver (activation offload, DeepSpeed) or for a "
        "larger micro-batch estimated at least 10% faster (the plan says why)."
    )


class DeepSpeedConfig(_Section):
    """DeepSpeed ZeRO (through the HF Trainer integration)."""
    enabled: Union[bool, Auto] = Field(
        False, description="Use DeepSpeed; 'auto' lets the planner decide (needs DeepSpeed installed)."
    )
    zero_stage: Literal[0, 1, 2, 3] = Field(
        2, description="ZeRO stage. On one GPU only offload saves memory: stage 2 moves optimizer states to CPU, "
        "stage 3 can also move the weights."
    )
    offload_optimizer: bool = Field(False, description="Keep optimizer states (and the update) on the CPU.")
    offload_params: bool = Field(False, description="Keep weights on the CPU between uses (ZeRO-3 only).")
    overlap_comm: bool = Field(False, description="Overlap gradient communication (faster, costs bucket memory).")


class DistributedConfig(_Section):
    """More than one GPU or machine: the same config through the DeepSpeed launcher or torchrun."""
    num_gpus: int = Field(1, gt=0, description="GPUs per machine (data-parallel ranks per node). Left unset on a "
                          "machine with several GPUs, the planner may choose to train on several (docs/gpus.md); "
                          "set, it is the number of cards used. Unset with distributed.gpus as a list: that list's "
                          "length.")
    gpus: Union[list[Union[int, str]], Auto] = Field(
        "auto", description="Which GPUs of this machine train: NVML indices as nvidia-smi numbers them (e.g. [1]) "
        "or UUIDs ('GPU-…', stable across reboots and driver updates). 'auto': the card(s) with the most usable "
        "memory, chosen and explained by the planner. The run's config.yaml records the chosen cards by UUID and "
        "the worker(s) start with CUDA_VISIBLE_DEVICES set to exactly those; telemetry follows them. [] is a CPU run "
        "(no card).", json_schema_extra=PLANNED_GPUS
    )
    layer_split: Union[bool, Auto] = Field(
        "auto", description="Split the model's decoder layers over this machine's cards in one process (transformers' "
        "device_map): each card holds its share of the layers and one card computes at a time, for a LoRA/QLoRA of a "
        "model no single card holds (docs/gpus.md). 'auto': the planner splits only where that fits and one card, or "
        "the cards as data-parallel ranks, do not; true: the layers are split over the cards of distributed.gpus "
        "(distributed.num_gpus of them); false: several cards are data-parallel ranks.", json_schema_extra=PLANNED_SPLIT)
    layers_per_gpu: Union[list[int], Auto] = Field(
        "auto", description="With the layers split: how many decoder layers each card holds, in distributed.gpus "
        "order (the first card also holds the embeddings, the last the final norm, the LM head and the loss; a "
        "model with tied embeddings keeps its head with them on the first card). 'auto': the planner's split, which "
        "leaves each card about the same room.", json_schema_extra=PLANNED_SPLIT)
    num_nodes: int = Field(1, gt=0, description="Machines; more than one needs a hostfile.")
    hostfile: Optional[str] = Field(None, description="DeepSpeed hostfile ('host slots=N' lines) for several machines.")
    launcher: Literal["auto", "single", "deepspeed", "torchrun"] = Field(
        "auto", description="'auto': one process for one GPU; for several, the deepspeed launcher when DeepSpeed is on, "
        "torchrun otherwise. 'single' is one process (one GPU only)."
    )
    master_port: int = Field(29500, gt=0, lt=65536, description="Rendezvous port: node 0 listens on it (open it in "
                             "node 0's firewall when several machines train; docs/multi-node.md).")
    node_rank: int = Field(0, ge=0, description="Which machine this is when several train (0 .. num_nodes-1; node 0 is "
                           "the first host of the hostfile, the others connect to it). The same config on every "
                           "machine, with --set distributed.node_rank=N on machine N (docs/multi-node.md).")
    master_addr: Optional[str] = Field(None, description="Address of node 0, where the machines meet. null: the first "
                                       "host of distributed.hostfile, or 127.0.0.1 on one machine.")

    @model_validator(mode="before")
    @classmethod
    def _gpus_count(cls, data):
        """``gpus: [a, b]`` without ``num_gpus``: two GPUs per machine (the list says how many)."""
        if isinstance(data, dict) and isinstance(data.get("gpus"), list) and data["gpus"] and "num_gpus" not in data:
            data = dict(data, num_gpus=len(data["gpus"]))
        return data

    @field_validator("layers_per_gpu")
    @classmethod
    def _layer_counts(cls, v):
        if isinstance(v, list) and (not v or any(isinstance(n, bool) or n < 1 for n in v)):
            raise ValueError("list one count of decoder layers (1 or more) per card, e.g. [22, 21, 21], or 'auto'")
        return v

    @property
    def ranks_per_node(self) -> int:
        """Data-parallel ranks (worker processes) per machine: one where the layers are split over the cards
        (``layer_split: true``), else one per GPU."""
        return 1 if self.layer_split is True else self.num_gpus

    @field_validator("gpus")
    @classmethod
    def _gpu_names(cls, v):
        if not isinstance(v, list):
            return v
        for g in v:
            if isinstance(g, bool) or (isinstance(g, int) and g < 0):
                raise ValueError(f"{g!r} is not a GPU: list NVML indices (0, 1, …) or UUIDs ('GPU-…' as "
                                 "'nvidia-smi -L' prints them)")
            if isinstance(g, str) and not re.fullmatch(r"(GPU|MIG)-[0-9A-Za-z-]+", g):
                raise ValueError(f"{g!r} is not a GPU index or UUID: list NVML indices (0, 1, …) or UUIDs ('GPU-…' "
                                 "as 'nvidia-smi -L' prints them)")
        if len(set(map(str, v))) != len(v):
            raise ValueError("names a GPU twice; list each card once")
        return v


class CheckpointConfig(_Section):
    """When to save, and how many to keep."""
    every_steps: int = Field(50, gt=0, description="Save a checkpoint every N optimizer steps.")
    keep_last: int = Field(3, gt=0, description="Keep the newest K checkpoints (older complete ones are deleted).")
    save_final_model: bool = Field(True, description="Write the trained model or adapter to final/.")


class RecoveryConfig(_Section):
    """What the supervisor does when the worker dies."""
    auto_resume: int = Field(0, ge=0, description="Restart a crashed worker from its last checkpoint up to N times.")
    oom_ladder: bool = Field(
        True, description="On out-of-memory: the chunked loss, halve micro-batch (doubling accumulation), "
        "checkpointing, the tiled MLP, then offload, resuming each time (docs/planner.md, 'The OOM ladder')."
    )
    ladder_keeps: Union[list[str], Auto] = Field(
        "auto", description="Settings the OOM ladder never changes (dotted keys, e.g. [deepspeed.enabled]); a step "
        "that would change one is skipped and named in the final message. 'auto': every setting your config gives "
        "a value; a run folder's config.yaml lists them, so resume and launch.sh keep them. [] lets the ladder "
        "change anything.", json_schema_extra=YOUR_SETTINGS
    )


class OutputConfig(_Section):
    """Where runs go."""
    runs_dir: str = Field("runs", description="Folder that holds run directories.")
    run_name: Optional[str] = Field(None, description="Run directory name; default '<name>-<date>-<time>'.")
    tensorboard: bool = Field(True, description="Write TensorBoard logs to <run>/tensorboard.")
    report_to: list[Literal["wandb", "mlflow"]] = Field(
        default_factory=list,
        description="Also report metrics to these trackers (HF integrations). Keys come from the environment or the "
        "OS keyring (WANDB_API_KEY, MLFLOW_TRACKING_TOKEN); MLflow's server from MLFLOW_TRACKING_URI.",
    )


class EvaluationConfig(_Section):
    """Sample answers during training, and early stopping on the validation loss."""
    sample_prompts: list[str] = Field(
        default_factory=list, description="Prompts the model answers during training (greedy); shown by step."
    )
    sample_every_steps: Optional[int] = Field(
        None, gt=0, description="Generate the sample answers every N steps; null: at each evaluation."
    )
    max_new_tokens: int = Field(64, gt=0, description="Longest sample answer, in tokens.")
    early_stopping_patience: Optional[int] = Field(
        None, gt=0, description="End the run after N evaluations without a better validation loss (final/ gets "
        "the best checkpoint); null: off."
    )
    early_stopping_min_delta: float = Field(
        0.0, ge=0.0, description="How much lower the validation loss must be to count as better."
    )


class NotifyConfig(_Section):
    """A webhook message when a run finishes, fails, stops or recovers from out-of-memory."""
    webhook_url_env: Optional[str] = Field(
        None, description="Name of the environment variable holding the webhook URL (the OS keyring entry "
        "'trainpilot/<this name>' when unset). The URL itself never goes in a config."
    )
    webhook_format: Literal["auto", "discord", "slack", "json"] = Field(
        "auto", description="Message format; 'auto' picks Discord or Slack from the URL, else plain JSON.",
        json_schema_extra=DETECTED,
    )
    events: list[Literal["finished", "failed", "stopped", "oom_recovered"]] = Field(
        default_factory=lambda: ["finished", "failed", "stopped", "oom_recovered"],
        description="Which outcomes send a message.",
    )

    @field_validator("webhook_url_env")
    @classmethod
    def _env_name(cls, v):
        if v is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError("name an environment variable (e.g. TRAINPILOT_WEBHOOK_URL) and put the URL in it; "
                             "never the URL itself")
        return v


class RunConfig(_Section):
    """A whole TrainPilot run."""
    schema_version: int = Field(SCHEMA_VERSION, description="Config format version.")
    name: str = Field("run", min_length=1, description="Short name for the run (used in the run folder name).")
    device: Literal["auto", "cuda", "cpu"] = Field("auto", description="Where to train; 'auto' uses CUDA when present.")
    preset: Optional[str] = Field(None, description="Preset the config was derived from (informational).")
    plan_goal: Literal["fastest", "most_headroom"] = Field(
        "fastest", description="What the planner optimises when values are 'auto'."
    )
    plan_allow_approximate: bool = Field(
        False, description="Let the planner propose savings that change the numerics: 8-bit (and paged) AdamW "
        "through bitsandbytes on CUDA, whose optimizer states are quantised to 8 bits per value."
    )
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    method: MethodConfig = Field(default_factory=MethodConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    speed: SpeedConfig = Field(default_factory=SpeedConfig)
    deepspeed: DeepSpeedConfig = Field(default_factory=DeepSpeedConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    checkpoints: CheckpointConfig = Field(default_factory=CheckpointConfig)
    recovery: RecoveryConfig = Field(default_factory=RecoveryConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    grpo: GrpoConfig = Field(default_factory=GrpoConfig)
    rewards: RewardsConfig = Field(default_factory=RewardsConfig)
    notify: NotifyConfig = Field(default_factory=NotifyConfig)
    _explicit: frozenset = PrivateAttr(default_factory=frozenset)  # dotted keys the user set (see validate)

    def __eq__(self, other: object) -> bool:
        """Equal values are equal configs (which keys were typed by the user does not matter here)."""
        return isinstance(other, RunConfig) and self.model_dump() == other.model_dump()

    __hash__ = None

    @field_validator("schema_version")
    @classmethod
    def _version(cls, v):
        if v != SCHEMA_VERSION:
            raise ValueError(f"this TrainPilot reads schema_version {SCHEMA_VERSION}; set schema_version: {SCHEMA_VERSION}")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", v):
            raise ValueError("use letters, digits, '.', '_' and '-' only (it becomes a folder name)")
        return v

    @model_validator(mode="after")
    def _cross_checks(self):
        problems = cross_check(self)
        if problems:
            raise CrossCheckError(problems)
        return self

    # -- derived values -------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        """Data-parallel ranks (GPUs × machines; one per machine where the layers are split over its cards)."""
        return self.distributed.ranks_per_node * self.distributed.num_nodes
