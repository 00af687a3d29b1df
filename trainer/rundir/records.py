"""Typed event records: one definition of each event's fields, shared by the writers (worker,
supervisor, CLI) and the readers (supervisor, ``status``, GUI).

A record is written with ``EventWriter.emit(record)`` and read back with ``parse_event(dict)``.
Readers tolerate what docs/design.md ("Events") promises: unknown event types (``parse_event`` returns
None), unknown fields (kept in ``extra``: objective metrics such as DPO rewards ride there), missing fields
(None). Units are in the field names (``_bytes``, ``_seconds``, ``_per_second``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional


@dataclass(frozen=True)
class EventRecord:
    """Fields every event has: ``time`` (Unix seconds, set when written) and unknown ``extra`` fields."""

    TYPE: ClassVar[str] = ""
    time: Optional[float] = None
    extra: dict = field(default_factory=dict, compare=False)

    def fields(self) -> dict[str, Any]:
        """The event's fields as written (no ``type``/``time``; ``extra`` merged in)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("time", "extra")}
        return {**out, **self.extra}

    @classmethod
    def from_event(cls, event: dict) -> "EventRecord":
        """The record of a parsed event dict (unknown fields go to ``extra``)."""
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kwargs = {k: v for k, v in event.items() if k in known}
        extra = {k: v for k, v in event.items() if k not in known and k != "type"}
        return cls(**kwargs, extra=extra)


@dataclass(frozen=True)
class RunStarted(EventRecord):
    """A worker started. ``engine_change``: set when it resumed a checkpoint another engine wrote (``from``, ``to``,
    ``carried``, ``not_carried``: trainer.rundir.checkpoints.engine_change). ``ranks_change``: set when it resumed a
    checkpoint written on another number of ranks (``from_ranks``, ``to_ranks``, the batch split before and after,
    ``message``: trainer.rundir.checkpoints.ranks_change). ``tokenizer``: whether the tokenizer
    trained with agrees with the model's own files (``status`` agrees/differs/not_checked, ``message``, and what
    was compared: trainer.worker.loading.tokenizer_check)."""

    TYPE: ClassVar[str] = "run_started"
    pid: Optional[int] = None
    resume_from: Optional[str] = None
    device: Optional[str] = None
    precision: Optional[str] = None
    world_size: int = 1
    engine_change: Optional[dict] = None
    tokenizer: Optional[dict] = None
    ranks_change: Optional[dict] = None


@dataclass(frozen=True)
class StepEvent(EventRecord):
    """One optimizer step (docs/design.md); objective-specific metrics ride in ``extra``."""

    TYPE: ClassVar[str] = "step"
    step: Optional[int] = None
    max_steps: Optional[int] = None
    epoch: Optional[float] = None
    loss: Optional[float] = None
    learning_rate: Optional[float] = None
    grad_norm: Optional[float] = None  # L2 norm of the step's whole gradient before any clipping (with the step fused
    # into backward: summed from each gradient as its hook consumed it); None when the trainer measured none
    tokens_per_second: Optional[float] = None
    samples_per_second: Optional[float] = None
    step_seconds: Optional[float] = None
    gpu_memory_allocated_bytes: Optional[int] = None
    gpu_memory_reserved_bytes: Optional[int] = None
    gpu_memory_peak_bytes: Optional[int] = None
    micro_batch_size: Optional[int] = None
    gradient_accumulation_steps: Optional[int] = None
    eta_seconds: Optional[float] = None


@dataclass(frozen=True)
class ObjectiveMetrics:
    """The objective's own metrics. They ride on ``step`` events as flat fields (docs/design.md), and on GRPO's ``eval``
    events (the validation prompts' sampled completions, scored by the run's rewards); only the fields the objective
    logged are written (``fields()`` leaves out None). The worker maps TRL's log keys onto these names
    (``trainer.worker.train.step_metrics``); the GUI charts them."""

    # DPO / KTO / ORPO (docs/preference.md)
    rewards_chosen: Optional[float] = None  # β·(log π − log π_ref) of the chosen answers, mean over the step
    rewards_rejected: Optional[float] = None
    rewards_margin: Optional[float] = None  # chosen − rejected reward
    reward_accuracy: Optional[float] = None  # share of pairs whose chosen reward is higher (0..1)
    kl: Optional[float] = None  # KTO's KL estimate; GRPO's mean KL to the reference (grpo.beta > 0)
    logps_chosen: Optional[float] = None  # summed log-probabilities (nats)
    logps_rejected: Optional[float] = None
    log_odds_ratio: Optional[float] = None  # ORPO
    log_odds_chosen: Optional[float] = None
    nll_loss: Optional[float] = None
    # GRPO (docs/grpo.md)
    reward: Optional[float] = None  # mean weighted total reward of the completions
    reward_std: Optional[float] = None
    rewards: Optional[dict] = None  # each reward function's {"mean", "std"}, by name
    no_signal_fraction: Optional[float] = None  # share of groups whose completions all scored the same (0..1)
    completion_length: Optional[float] = None  # mean completion length, tokens
    completion_clipped: Optional[float] = None  # share cut at grpo.max_completion_length (0..1)
    entropy: Optional[float] = None  # mean token entropy of the completions, nats
    ratio_clipped_low: Optional[float] = None  # share of completion tokens (completions, GSPO) whose ratio hit 1 − epsilon
    ratio_clipped_high: Optional[float] = None  # ... that hit 1 + grpo.epsilon_high (both 0 at grpo.num_iterations 1)

    def fields(self) -> dict[str, Any]:
        """The metrics that were logged, as event fields."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


OBJECTIVE_FIELDS = tuple(f.name for f in dataclasses.fields(ObjectiveMetrics))


@dataclass(frozen=True)
class EvalEvent(EventRecord):
    """One evaluation on the validation data: ``eval_loss`` and ``perplexity`` (supervised and preference runs); for
    GRPO, whose validation loss is a policy-gradient term that says nothing of quality, the validation prompts'
    sampled completions scored by the run's rewards instead: ``reward``, ``reward_std``, ``rewards`` (per function)
    and the other ``ObjectiveMetrics`` fields, and no ``eval_loss``."""

    TYPE: ClassVar[str] = "eval"
    step: Optional[int] = None
    eval_loss: Optional[float] = None
    perplexity: Optional[float] = None
    reward: Optional[float] = None
    reward_std: Optional[float] = None
    rewards: Optional[dict] = None


@dataclass(frozen=True)
class SampleEvent(EventRecord):
    TYPE: ClassVar[str] = "sample"
    step: Optional[int] = None
    prompt: Optional[str] = None
    text: Optional[str] = None
    tokens: Optional[int] = None


@dataclass(frozen=True)
class CheckpointSaved(EventRecord):
    TYPE: ClassVar[str] = "checkpoint_saved"
    step: Optional[int] = None
    path: Optional[str] = None
    seconds: Optional[float] = None
    bytes: Optional[int] = None


@dataclass(frozen=True)
class WarningEvent(EventRecord):
    TYPE: ClassVar[str] = "warning"
    code: Optional[str] = None
    message: Optional[str] = None


@dataclass(frozen=True)
class OomEvent(EventRecord):
    TYPE: ClassVar[str] = "oom"
    message: Optional[str] = None


@dataclass(frozen=True)
class RetryEvent(EventRecord):
    """The supervisor starts another attempt: ``changes`` (dotted key → value) and ``why``; it resumes from
    ``resume_from`` (a checkpoint folder, or None: step 0) at ``resume_step``. ``engine_change``: set when the changes
    move the run to another engine (plain ↔ DeepSpeed, another ZeRO stage or optimizer): what carries over."""

    TYPE: ClassVar[str] = "retry"
    attempt: Optional[int] = None
    reason: Optional[str] = None
    why: Optional[str] = None
    changes: Optional[dict] = None
    resume_from: Optional[str] = None
    resume_step: int = 0
    engine_change: Optional[dict] = None


@dataclass(frozen=True)
class StopRequested(EventRecord):
    TYPE: ClassVar[str] = "stop_requested"
    step: Optional[int] = None
    source: Optional[str] = None


@dataclass(frozen=True)
class Stopped(EventRecord):
    TYPE: ClassVar[str] = "stopped"
    step: Optional[int] = None
    checkpoint: Optional[str] = None


@dataclass(frozen=True)
class EarlyStopped(EventRecord):
    TYPE: ClassVar[str] = "early_stopped"
    step: Optional[int] = None
    best_step: Optional[int] = None
    metric: Optional[str] = None  # the metric's name, e.g. "eval_loss"
    best_value: Optional[float] = None
    patience: Optional[int] = None
    min_delta: Optional[float] = None
    checkpoint: Optional[str] = None


@dataclass(frozen=True)
class Finished(EventRecord):
    TYPE: ClassVar[str] = "finished"
    step: Optional[int] = None
    final: Optional[str] = None
    loss: Optional[float] = None


@dataclass(frozen=True)
class Failed(EventRecord):
    """The run failed: ``message`` says why and what to do. ``phase`` is "start" for a start the GUI
    recorded because the CLI failed before the supervisor ran (no status.json then)."""

    TYPE: ClassVar[str] = "failed"
    message: Optional[str] = None
    exit_code: Optional[int] = None
    kind: Optional[str] = None
    phase: Optional[str] = None


RECORDS: dict[str, type[EventRecord]] = {c.TYPE: c for c in (
    RunStarted, StepEvent, EvalEvent, SampleEvent, CheckpointSaved, WarningEvent, OomEvent, RetryEvent,
    StopRequested, Stopped, EarlyStopped, Finished, Failed)}
STEP_FIELDS = tuple(f.name for f in dataclasses.fields(StepEvent) if f.name not in ("time", "extra"))


def parse_event(event: dict) -> Optional[EventRecord]:
    """The typed record of an event dict; None for a type this version does not know."""
    cls = RECORDS.get(event.get("type"))
    return cls.from_event(event) if cls else None
