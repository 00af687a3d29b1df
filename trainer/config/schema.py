"""The run config: one typed schema for everything a run needs.

The YAML presets, the CLI's ``--set`` overrides, the GUI's advanced form and the README's config
reference are all derived from the models below; nothing restates a default elsewhere.
Light module: pydantic and PyYAML only (the GUI imports it).
"""
from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from trainer.core.dotted import flatten, set_in
from trainer.core.secrets import TOKEN_PATTERN, secret_values

SCHEMA_VERSION = 1
Auto = Literal["auto"]
# Marks a field whose "auto" means "detected from the input when it is used" (a file's type from its
# name, records' shape from their fields), not a choice for this machine: the planner leaves it as is.
DETECTED = {"auto": "detected when used"}
# Marks a field only one objective reads: the planner resolves its "auto" for runs of that objective and leaves it
# for the others (so resolved configs of other runs, and run folders made before the field existed, stay valid).
PLANNED_FOR_GRPO = {"auto": "planned for GRPO runs"}


class ConfigError(Exception):
    """Bad user input. ``problems`` lists ``(field path, message with the fix)`` pairs."""
    def __init__(self, problems: list[tuple[str, str]], source: str | None = None):
        self.problems = problems
        self.source = source
        super().__init__(self.render())

    def render(self) -> str:
        head = f"{self.source}: " if self.source else ""
        if len(self.problems) == 1:
            loc, msg = self.problems[0]
            return f"{head}{loc}: {msg}" if loc else f"{head}{msg}"
        lines = [f"{head}{len(self.problems)} problems in the config:"]
        lines += [f"  - {loc}: {msg}" if loc else f"  - {msg}" for loc, msg in self.problems]
        return "\n".join(lines)


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
    tokenizer_vocab_size: int = Field(
        8192, ge=300, description="Vocabulary size when model.tokenizer is 'corpus' (a BPE tokenizer trained on the "
        "training data, cached, saved into the run and final/)."
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
    record_format: Literal["auto", "text", "template", "alpaca", "prompt_completion", "chat", "sharegpt", "preference",
                           "kto"] = Field(
        "auto", description="Shape of the records (not the file type): 'auto' detects it from the fields "
        "(messages → chat, conversations → sharegpt, instruction/output → alpaca, ...). See docs/data.md.",
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
    num_proc: int = Field(0, ge=0, description="Tokenizing processes for files from 8 MiB (each takes every n-th "
                          "chunk); 0 means 1 (the tokenizer's threads already use every core).")


class MethodConfig(_Section):
    """Full fine-tune or adapters."""
    type: Literal["full", "lora", "qlora"] = Field(
        "full", description="full trains every weight; lora trains low-rank adapters; qlora adds 4-bit base weights (CUDA)."
    )
    lora_r: int = Field(16, gt=0, description="Adapter rank.")
    lora_alpha: int = Field(32, gt=0, description="Adapter scaling (alpha / r multiplies the update).")
    lora_dropout: float = Field(0.05, ge=0.0, lt=1.0, description="Dropout on adapter inputs.")
    target_modules: Union[list[str], Literal["all-linear"]] = Field(
        "all-linear", description="Modules that get adapters: 'all-linear' or names like [q_proj, v_proj]."
    )


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
    optimizer: Literal["adamw", "adamw_8bit", "paged_adamw_8bit"] = Field(
        "adamw", description="adamw (fused when speed.fused_adamw), adamw_8bit or paged_adamw_8bit (bitsandbytes, "
        "CUDA: 8-bit states; paged ones move to host RAM under memory pressure). The planner proposes adamw_8bit "
        "when it does not fit otherwise and plan_allow_approximate is true."
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
    epsilon: float = Field(0.2, gt=0, description="Clipping range of the policy ratio.")
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
    exact_answer: float = Field(0.0, ge=0.0, description="Weight of the exact-match reward: 1 when the extracted "
                                "answer equals the reference (whitespace and case ignored), else 0.")
    numeric_answer: float = Field(0.0, ge=0.0, description="Weight of the numeric reward: 1 when the extracted "
                                  "answer is a number within numeric_tolerance of the reference, else 0.")
    numeric_tolerance: float = Field(1e-6, ge=0.0, description="Allowed relative difference for numeric_answer.")
    format: float = Field(0.0, ge=0.0, description="Weight of the format reward: 1 when the completion matches "
                          "format_pattern, else 0.")
    format_pattern: str = Field(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$",
                                description="Regex (DOTALL) the whole completion must match for the format reward.")
    json_valid: float = Field(0.0, ge=0.0, description="Weight of the JSON reward: 1 when the completion (or its "
                              "extracted answer) parses as JSON, else 0.")
    length_penalty: float = Field(0.0, ge=0.0, description="Weight of the length penalty: 0 up to length_target "
                                  "tokens, falling linearly to -1 at max_completion_length.")
    length_target: int = Field(128, gt=0, description="Completion length (tokens) the length penalty starts at.")
    python: Optional[str] = Field(
        None, description="A .py file of reward functions with TRL's signature "
        "f(prompts, completions, **kwargs) -> list[float] (record fields arrive as keyword lists); every public "
        "function defined in it is used. Checked before the run starts; it runs on your machine, in the worker."
    )
    python_weights: dict[str, float] = Field(
        default_factory=dict, description="Weights of the Python file's functions by name (default 1.0 each)."
    )


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
    chunked_loss: Union[bool, Auto] = Field(
        "auto", description="Supervised loss over chunks of tokens, never the full tokens × vocabulary logits (same "
        "loss and gradients; Liger's fused kernel on CUDA when liger-kernel is installed). 'auto': on where exact "
        "(Llama, Mistral, Qwen, Phi, StableLM, T5 families); false: HF's loss."
    )
    activation_offload: Union[bool, Auto] = Field(
        "auto", description="Move saved activations to pinned host RAM in forward and back in backward (TRL's "
        "activation offloading; CUDA only). Costs host RAM and PCIe time; 'auto' lets the planner decide."
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
    num_gpus: int = Field(1, gt=0, description="GPUs per machine (data-parallel ranks per node).")
    num_nodes: int = Field(1, gt=0, description="Machines; more than one needs a hostfile.")
    hostfile: Optional[str] = Field(None, description="DeepSpeed hostfile ('host slots=N' lines) for several machines.")
    launcher: Literal["auto", "single", "deepspeed", "torchrun"] = Field(
        "auto", description="'auto': one process for one GPU; for several, the deepspeed launcher when DeepSpeed is on, "
        "torchrun otherwise. 'single' is one process (one GPU only)."
    )
    master_port: int = Field(29500, gt=0, lt=65536, description="Rendezvous port.")


class CheckpointConfig(_Section):
    """When to save, and how many to keep."""
    every_steps: int = Field(50, gt=0, description="Save a checkpoint every N optimizer steps.")
    keep_last: int = Field(3, gt=0, description="Keep the newest K checkpoints (older complete ones are deleted).")
    save_final_model: bool = Field(True, description="Write the trained model or adapter to final/.")


class RecoveryConfig(_Section):
    """What the supervisor does when the worker dies."""
    auto_resume: int = Field(0, ge=0, description="Restart a crashed worker from its last checkpoint up to N times.")
    oom_ladder: bool = Field(
        True, description="On out-of-memory: halve micro-batch (doubling accumulation), then checkpointing, "
        "then offload, resuming each time."
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
            raise _CrossCheckError(problems)
        return self

    # -- derived values -------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        """Data-parallel ranks (GPUs × machines)."""
        return self.distributed.num_gpus * self.distributed.num_nodes


class _CrossCheckError(ValueError):
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
    if cfg.distributed.launcher == "single" and ranks > 1:
        p.append(("distributed.launcher", f"'single' runs one process but {ranks} GPUs are configured; "
                  "set distributed.launcher: auto (or deepspeed / torchrun)"))
    if ds.offload_params and ds.zero_stage != 3:
        p.append(("deepspeed.offload_params", "parameter offload needs zero_stage: 3; set zero_stage: 3 or offload_params: false"))
    if ds.enabled is False and (ds.offload_optimizer or ds.offload_params):
        p.append(("deepspeed.enabled", "offload needs DeepSpeed; set deepspeed.enabled: true (or auto) or turn offload off"))
    if cfg.method.type == "qlora" and ds.enabled is True and ds.zero_stage == 3:
        p.append(("method.type", "QLoRA 4-bit weights cannot be sharded by ZeRO-3; use zero_stage 2 or no DeepSpeed"))
    if (cfg.data.prompt_template is None) != (cfg.data.response_template is None):
        which = "response_template" if cfg.data.prompt_template else "prompt_template"
        p.append((f"data.{which}", "prompt_template and response_template go together; set both, or neither to use text_field"))
    if cfg.distributed.num_nodes > 1 and not cfg.distributed.hostfile:
        p.append(("distributed.hostfile", "several machines need a hostfile ('hostname slots=N' per line)"))
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
    if cfg.device == "cpu" and cfg.speed.precision == "fp16":
        p.append(("speed.precision", "fp16 mixed precision needs a GPU; use fp32 or bf16 on the CPU"))
    return p


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


BUILTIN_REWARDS = ("exact_answer", "numeric_answer", "format", "json_valid", "length_penalty")


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
    if g.max_completion_length >= cfg.data.seq_len:
        p.append(("grpo.max_completion_length", f"{g.max_completion_length} leaves no room for the prompt in "
                  f"data.seq_len {cfg.data.seq_len}; raise data.seq_len or lower max_completion_length"))
    if cfg.evaluation.early_stopping_patience:
        p.append(("evaluation.early_stopping_patience", "GRPO's validation loss is a policy-gradient term, not a "
                  "measure of quality (it does not fall as the model improves); early stopping on it would stop at "
                  "random: remove evaluation.early_stopping_patience"))
    if not any(getattr(r, k) > 0 for k in BUILTIN_REWARDS) and not r.python:
        p.append(("rewards", "GRPO needs at least one reward: give a built-in one a weight (e.g. rewards.exact_answer: "
                  "1.0) or set rewards.python to a file of reward functions"))
    return p


# ---------------------------------------------------------------------------------------------
# Loading, overrides, errors
# ---------------------------------------------------------------------------------------------
_SECTIONS = {name: f.annotation for name, f in RunConfig.model_fields.items()
             if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)}


def known_keys(path: tuple[str, ...] = ()) -> list[str]:
    """Field names valid at a dotted location (``()`` is the top level)."""
    model: type[BaseModel] = RunConfig
    for part in path:
        model = _SECTIONS.get(part) if model is RunConfig else None  # type: ignore[assignment]
        if model is None:
            return []
    return list(model.model_fields)


def _suggest(key: str, path: tuple[str, ...]) -> str:
    options = known_keys(path)
    close = difflib.get_close_matches(key, options, n=1, cutoff=0.6)
    if close:
        return f"unknown key '{key}'; did you mean '{close[0]}'?"
    # A key put in the wrong section is a common slip: look in the others.
    for sec, model in _SECTIONS.items():
        if key in model.model_fields:
            return f"unknown key '{key}' here; it belongs in '{sec}' ({sec}.{key})"
    return f"unknown key '{key}'; valid keys: {', '.join(options)}"


def _fix_for(err: dict) -> str:
    kind, msg = err["type"], err["msg"]
    inp = err.get("input")
    if kind == "extra_forbidden":
        loc = tuple(str(x) for x in err["loc"])
        return _suggest(loc[-1], loc[:-1])
    if kind in ("greater_than", "greater_than_equal"):
        return f"{msg.lower()} (got {inp!r}); use a positive value"
    if kind in ("int_parsing", "int_type", "float_parsing", "float_type", "bool_parsing", "bool_type"):
        want = {"int": "a whole number", "flo": "a number", "boo": "true or false"}[kind[:3]]
        return f"expected {want}, got {inp!r}"
    if kind in ("literal_error", "union_tag_invalid"):
        return f"got {inp!r}; {msg[0].lower() + msg[1:]}"
    if kind == "model_type":
        return f"expected a mapping of keys (a YAML section), got {inp!r}"
    if kind == "value_error":
        return msg.removeprefix("Value error, ")
    return msg


_BRANCH_WORDS = {"int": "a positive whole number", "bool": "true or false", "list[str]": "a list of names"}


def _is_branch(part: object) -> bool:
    return isinstance(part, str) and (part in _BRANCH_WORDS or part.startswith("literal["))


def _dedupe_union(errors: list[dict]) -> list[dict]:
    """Union fields (``int | 'auto'``) report one error per branch: merge them into one per field."""
    by_loc: dict[tuple, list[dict]] = {}
    for e in errors:
        loc = tuple(str(x) for x in e["loc"] if not _is_branch(x))
        by_loc.setdefault(loc, []).append(e)
    out = []
    for loc, errs in by_loc.items():
        if len(errs) == 1:
            out.append(dict(errs[0], loc=loc))
            continue
        own = [e for e in errs if e["type"] == "value_error"]  # our validator's message is the precise one
        if own:
            out.append(dict(own[0], loc=loc))
            continue
        wanted = []
        for e in errs:
            branch = next((x for x in e["loc"] if _is_branch(x)), "")
            wanted.append(_BRANCH_WORDS.get(branch) or branch.removeprefix("literal[").removesuffix("]"))
        out.append(dict(errs[0], loc=loc, type="custom",
                        msg=f"expected {' or '.join(wanted)}, got {errs[0].get('input')!r}"))
    return out


def validate(data: Any, source: str | None = None) -> RunConfig:
    """Build a RunConfig from plain data; raise ConfigError listing every problem at once."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([("", f"the config must be a YAML mapping of sections, not {type(data).__name__}")], source)
    data = _drop_legacy_keys(data)
    model = data.get("model")
    extra = model.get("hub_token_env") if isinstance(model, dict) else None
    secret_values = _secret_env_values((extra,) if isinstance(extra, str) else ())
    tokens = _find_tokens(data, secret_values)
    problems = [(path, "looks like a secret token; never put tokens in a config: set the "
                 "HF_TOKEN environment variable (or model.hub_token_env) instead")
                for path, _ in tokens]
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as exc:
        for e in _dedupe_union(exc.errors(include_url=False)):
            ctx_err = (e.get("ctx") or {}).get("error")
            if isinstance(ctx_err, _CrossCheckError):
                problems += ctx_err.problems
                continue
            problems.append((".".join(e["loc"]), _fix_for(e)))
        raise ConfigError(_scrub(problems, [v for _, v in tokens] + secret_values), source) from None
    if problems:
        raise ConfigError(problems, source)
    cfg._explicit = frozenset(flatten(data))
    return cfg


LEGACY_KEYS = (("distributed", "backend"),)  # read by no code; accepted (and dropped) so old run folders resume


def _drop_legacy_keys(data: dict) -> dict:
    out = dict(data)
    for section, key in LEGACY_KEYS:
        if isinstance(out.get(section), dict) and key in out[section]:
            out[section] = {k: v for k, v in out[section].items() if k != key}
    return out


def _secret_env_values(extra_names: tuple[str, ...] = ()) -> list[str]:
    """Secret values in the environment, longest first (``trainer.core.secrets``' one rule; no keyring
    lookup here). ``extra_names``: more variables holding secrets (the config's ``model.hub_token_env``)."""
    return secret_values(extra_names, keyring=False)


def _scrub(problems: list[tuple[str, str]], values: list[str]) -> list[tuple[str, str]]:
    # Messages echo the offending input ("got '...'"): a token put in the wrong field must not be echoed.
    out = []
    for loc, msg in problems:
        for v in sorted(set(values), key=len, reverse=True):
            msg = msg.replace(v, "***")
        out.append((loc, TOKEN_PATTERN.sub("***", msg)))
    return out


def _find_tokens(data: Any, secret_values: list[str] = (), path: str = "") -> list[tuple[str, str]]:
    """``(field path, value)`` of strings that are token-shaped or contain a secret from the environment."""
    found = []
    if isinstance(data, dict):
        for k, v in data.items():
            found += _find_tokens(v, secret_values, f"{path}.{k}" if path else str(k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            found += _find_tokens(v, secret_values, f"{path}[{i}]")
    elif isinstance(data, str) and (TOKEN_PATTERN.search(data) or any(v in data for v in secret_values)):
        found.append((path, data))
    return found


def read_yaml(path: str | Path) -> dict:
    """Read a YAML mapping from a file; ConfigError (naming the file and line) when it cannot be read."""
    p = Path(path)
    if not p.exists():
        raise ConfigError([("", f"config file not found: {p}; check the path")])
    if p.is_dir():
        raise ConfigError([("", f"{p} is a folder; pass the config .yaml file (a run folder holds config.yaml)")])
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError([("", f"{p} is not UTF-8 text; save the config as UTF-8")]) from None
    except OSError as exc:
        raise ConfigError([("", f"cannot read {p}: {exc.strerror}; check its permissions")]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "malformed YAML"
        raise ConfigError([("", f"{p}: YAML syntax error{where}: {problem}; fix the indentation or quoting there")]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([("", f"{p} must hold a YAML mapping of sections (model:, data:, training: ...)")])
    return data


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse ``key.path=value`` (value is YAML: numbers, true/false, null, lists)."""
    if "=" not in item:
        raise ConfigError([("--set", f"'{item}' is not key.path=value (e.g. training.learning_rate=1e-4)")])
    key, raw = item.split("=", 1)
    keys = [k for k in key.strip().split(".") if k]
    if not keys:
        raise ConfigError([("--set", f"'{item}' has no key before '='")])
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return keys, value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Return a copy of ``data`` with dotted overrides applied (unknown keys caught by validate)."""
    import copy

    out = copy.deepcopy(data)
    for item in overrides or []:
        keys, value = parse_override(item)
        set_in(out, ".".join(keys), value)
    return out


def load(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Load a config file, apply ``--set`` overrides, validate. Raises ConfigError."""
    data = apply_overrides(read_yaml(path), overrides or [])
    return validate(data, source=str(path))


def to_dict(cfg: RunConfig) -> dict:
    """Plain data, every field present (so the dump is complete and round-trips exactly)."""
    return cfg.model_dump(mode="json")


def dump_yaml(cfg: RunConfig) -> str:
    """The resolved config as YAML text (sections in schema order)."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=False, allow_unicode=True)


def replace(cfg: RunConfig, **dotted: Any) -> RunConfig:
    """A validated copy with dotted changes, e.g. ``replace(cfg, **{"training.micro_batch_size": 2})``.
    The copy remembers which keys the user set (``explicit_keys``); the changed keys are not added."""
    data = to_dict(cfg)
    for key, value in dotted.items():
        set_in(data, key, value)
    out = validate(data)
    out._explicit = cfg._explicit
    return out


def explicit_keys(cfg: RunConfig) -> frozenset[str]:
    """Dotted keys the user's config (file, ``--set``, GUI) set itself; everything else is a default."""
    return cfg._explicit


def field_docs() -> list[tuple[str, str, str, str]]:
    """``(dotted key, type, default, description)`` for every field: the config reference."""
    rows = []

    def walk(model: type[BaseModel], prefix: str):
        for name, f in model.model_fields.items():
            ann = f.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, f"{prefix}{name}.")
                continue
            default = f.get_default(call_default_factory=True)
            rows.append((f"{prefix}{name}", _type_name(ann), yaml.safe_dump(default).strip().removesuffix("...").strip(),
                         f.description or ""))

    walk(RunConfig, "")
    return rows


def _type_name(ann: Any) -> str:
    text = str(ann).replace("typing.", "").replace("NoneType", "null")
    text = re.sub(r"<class '(\w+)'>", r"\1", text)
    text = re.sub(r"Optional\[(.*)\]", r"\1 | null", text)
    return text
