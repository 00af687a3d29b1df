"""Worker side: GRPO (``training.objective: grpo``) through TRL's ``GRPOTrainer``.

Each optimizer step samples ``grpo.num_generations`` completions per prompt, scores them with the run's
rewards (``trainer.data.rewards``), and moves the policy toward the completions that beat their group's mean.
Batches count completions: ``training.micro_batch_size`` completions per forward/backward,
``training.effective_batch_size`` per optimizer step, ``grpo.generation_batch_size`` sampled at once per GPU
(TRL's ``generation_batch_size`` is that times the world size; it divides the step, so every optimizer step
starts on a fresh sampling pass and a resume never needs generations buffered before the checkpoint).

The model and its adapters are built as for DPO (``objectives``): full, LoRA, or QLoRA on CUDA. The reference
(``grpo.beta`` > 0): the adapters switched off under LoRA/QLoRA; a frozen copy of the starting weights for a full
fine-tune (TRL loads it from the model's folder; a random-init model is saved aside for that).

Beyond TRL: the prompt budget (``data.seq_len - grpo.max_completion_length`` tokens) is checked up front, since
TRL 1.16 has no ``max_prompt_length`` (preflight's ``probes.grpocheck`` refuses first; here too-long prompts are
skipped under ``data.skip_bad_lines``); ``sample`` events carry sampled completions with their rewards and
advantage; a ``no_learning_signal`` warning says when every group keeps scoring the same; an out-of-memory error
says its phase (sampling or update) on the ``oom`` event, for the ladder; the prompt order of every epoch is
reproducible after a resume (TRL's sampler draws each epoch's order from one generator that a resumed run would
restart).
"""
from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import RepeatSampler

from trainer.core import capabilities
from trainer.core.errors import UserError
from trainer.data.rewards import reward_functions
from trainer.rundir.records import SampleEvent, WarningEvent
from trainer.worker.datapipe import grpo_prompts
from trainer.worker.loading import modeling

NO_SIGNAL_FRACTION = 0.95  # share of groups whose answers all scored the same that counts as "no signal"


def build(cfg, tokenizer, precision: str, use_cuda: bool, make_args, common: dict, trainer_class):
    """``(trainer, info)`` for a GRPO run. ``trainer_class(base)`` applies TrainPilotMixin to ``base``."""

    g = cfg.grpo
    if g.use_vllm and not capabilities.installed("vllm"):  # preflight refuses it first (planning.requirements)
        raise UserError("grpo.use_vllm: vLLM is not installed in this environment; install it (pip install vllm, "
                        "CUDA only) or set grpo.use_vllm: false to sample with transformers", field="grpo.use_vllm")
    rewards = reward_functions(cfg)
    train, val, too_long, unreadable = _datasets(cfg, tokenizer)
    model = modeling.load_model(cfg, precision, use_cuda, apply_method=False)
    args = make_args(GRPOConfig, **_grpo_arguments(cfg, rewards, val is not None))
    kwargs = dict(model=model, reward_funcs=[r.func for r in rewards], args=args, train_dataset=train,
                  eval_dataset=val, processing_class=tokenizer, **dict(common, shuffle=True))
    if cfg.method.type != "full":
        kwargs["peft_config"] = modeling.lora_config(cfg, model)  # TRL wraps it; the reference = adapters off
    with _reference_source(model, cfg.method.type == "full" and g.beta > 0):
        trainer = trainer_class(TrainPilotGRPOTrainer)(**kwargs)
    trainer.tp_reward_weights = {r.name: r.weight for r in rewards}
    world = int(os.environ.get("WORLD_SIZE", "1"))
    info = {"train_samples": len(train), "eval_samples": len(val) if val is not None else 0,
            "skipped_lines": len(unreadable), "skipped_line_numbers": unreadable[:20], "objective": "grpo",
            "reference_model": _reference_kind(cfg), "reward_functions": [r.name for r in rewards],
            "reward_weights": [r.weight for r in rewards], "num_generations": g.num_generations,
            "generation_batch_size": args.generation_batch_size // world, "prompts_too_long": len(too_long),
            "prompts_too_long_where": too_long[:20], "num_iterations": trainer.num_iterations,  # as TRL took them
            "importance_sampling_level": trainer.importance_sampling_level,
            "clip_range": [trainer.epsilon_low, trainer.epsilon_high]}
    return trainer, info


def _grpo_arguments(cfg, rewards, has_eval: bool) -> dict:
    """GRPOConfig fields beyond the recipe's TrainingArguments (``make_args`` adds those). A generation batch left
    "auto" (a hand-made config the planner did not resolve) is TRL's default: one sampling pass per step."""
    g, t = cfg.grpo, cfg.training
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_gpu = g.generation_batch_size if isinstance(g.generation_batch_size, int) else None
    out = dict(num_generations=g.num_generations, max_completion_length=g.max_completion_length,
               generation_batch_size=per_gpu * world if per_gpu else None, temperature=g.temperature, top_p=g.top_p,
               top_k=g.top_k, beta=g.beta, epsilon=g.epsilon, epsilon_high=g.epsilon_high,
               importance_sampling_level=g.importance_sampling_level, num_iterations=g.num_iterations,
               loss_type=g.loss_type, scale_rewards=g.scale_rewards,
               mask_truncated_completions=g.mask_truncated_completions, use_vllm=g.use_vllm,
               vllm_mode="colocate", reward_weights=[r.weight for r in rewards], shuffle_dataset=cfg.data.shuffle,
               log_completions=False,  # our own sample events; TRL's would write parquet into checkpoints/
               disable_dropout=True)
    if has_eval:  # an evaluation batch holds whole groups
        out["num_generations_eval"] = math.gcd(t.micro_batch_size * world, g.num_generations)
    return out


def _reference_kind(cfg) -> str | None:
    if cfg.grpo.beta == 0:
        return None
    return "adapters_disabled" if cfg.method.type != "full" else "frozen_copy"


class _reference_source:
    """For a full fine-tune with beta > 0 TRL loads the reference from ``model.config._name_or_path``; a model
    built from an architecture (random init) has none, so its starting weights are saved aside meanwhile."""

    def __init__(self, model, needed: bool):
        self.model, self.folder = model, None
        self.needed = needed and not model.config._name_or_path

    def __enter__(self):
        if self.needed:
            self.folder = tempfile.mkdtemp(prefix="trainpilot-grpo-ref-")
            self.model.save_pretrained(self.folder)
            self.model.config._name_or_path = self.folder

    def __exit__(self, *exc):
        if self.folder:
            self.model.config._name_or_path = ""
            shutil.rmtree(self.folder, ignore_errors=True)


# -- data ------------------------------------------------------------------------------------------
def _datasets(cfg, tokenizer):
    """(train, validation or None, where the training prompts skipped as too long were, unreadable lines skipped)."""
    import datasets

    datasets.disable_progress_bars()
    d = cfg.data
    found = grpo_prompts.prompt_rows(cfg, tokenizer, d.path)  # preflight (probes.grpocheck) refused the same first
    train = datasets.Dataset.from_list(found.rows)
    val = None
    if d.validation_path:
        val = datasets.Dataset.from_list(grpo_prompts.prompt_rows(cfg, tokenizer, d.validation_path,
                                                                  role="data.validation_path").rows)
    elif d.validation_split > 0:
        parts = train.train_test_split(test_size=d.validation_split, seed=cfg.training.seed, shuffle=True)
        train, val = parts["train"], parts["test"]
    return train, val, found.too_long, found.unreadable


# -- the trainer -------------------------------------------------------------------------------------
class EpochRepeatSampler(RepeatSampler):
    """TRL's RepeatSampler, with each epoch's prompt order drawn from ``seed + epoch`` (HF's Trainer calls
    ``set_epoch``), so a run resumed in epoch 3 walks the prompts in the order the uninterrupted run did
    (TRL's draws epoch after epoch from one generator, which a resumed run restarts at epoch 0's order)."""

    _tp_epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self._tp_epoch = int(epoch)

    def __iter__(self):
        if self.shuffle:
            self.generator.manual_seed((self.seed or 0) + self._tp_epoch)
        return super().__iter__()


class TrainPilotGRPOTrainer(GRPOTrainer):
    """GRPOTrainer with the epoch-seeded prompt order, real-token counting of the trained micro-batches, the last
    sampling pass kept for ``sample`` events, and out-of-memory errors marked with their phase (``tp_phase``:
    "sampling" or "update"; the oom event says it). Apply ``objectives.trainer_class`` to it (TrainPilotMixin first)."""

    def _get_train_sampler(self, dataset=None):
        base = super()._get_train_sampler(dataset)
        return EpochRepeatSampler(data_source=base.data_source, mini_repeat_count=base.mini_repeat_count,
                                  batch_size=base.batch_size, repeat_count=base.repeat_count, shuffle=base.shuffle,
                                  seed=base.seed)

    def training_step(self, model, inputs, num_items_in_batch):
        try:
            return super().training_step(model, inputs, num_items_in_batch)
        except torch.OutOfMemoryError as exc:  # the supervisor's ladder picks its rung by phase
            exc.tp_phase = getattr(exc, "tp_phase", None) or "update"
            raise

    def _generate_and_score_completions(self, inputs):
        try:
            if self.model.training:
                self._tp_inject_sampling_oom()
            return super()._generate_and_score_completions(inputs)
        except torch.OutOfMemoryError as exc:
            exc.tp_phase = "sampling"
            raise

    def _tp_inject_sampling_oom(self) -> None:
        """TRAINPILOT_INJECT_OOM="STEP:MIN_GEN:sampling" (tests of the ladder's generation-batch rung)."""
        inject = getattr(self, "_inject_oom", None)
        per_gpu = self.args.generation_batch_size // self.accelerator.num_processes
        if inject and inject[2] == "sampling" and self.state.global_step + 1 >= inject[0] and per_gpu > inject[1]:
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected while sampling {per_gpu} completions at step "
                                         f"{self.state.global_step + 1})")

    def _generate(self, prompts: list):
        out = super()._generate(prompts)
        if self.model.training:
            self._tp_rollout = (out[0], out[1])  # this rank's prompt ids and completion ids, in _logs' order
        return out

    def _prepare_inputs(self, generation_batch):
        inputs = super()._prepare_inputs(generation_batch)
        if self.model.training:  # real tokens of the micro-batch trained now: its prompts and completions
            self.tp_tokens += int(inputs["prompt_mask"].sum()) + int(inputs["completion_mask"].sum())
        return inputs

    def _tp_samples(self, count: int) -> list[dict]:
        """Up to ``count`` completions of the latest sampling pass, from the group whose rewards spread the most
        (best, worst, then the next best...): prompt (rendered), text, tokens, reward (weighted), rewards, advantage."""
        rollout = getattr(self, "_tp_rollout", None)
        if not count or rollout is None or not self._logs["completion"]:
            return []
        prompt_ids, completion_ids = rollout
        n_local, k = len(completion_ids), self.num_generations
        names = list(self.tp_reward_weights)
        rows = []
        for i in range(n_local):  # this rank's entries come first in _logs (gathered by rank)
            per = {name: _number(self._logs["rewards"][name][i]) for name in names}
            total = sum(self.tp_reward_weights[n] * v for n, v in per.items() if v is not None)
            rows.append({"prompt": self.processing_class.decode(prompt_ids[i], skip_special_tokens=False),
                         "text": _content(self._logs["completion"][i]), "tokens": len(completion_ids[i]),
                         "reward": total, "rewards": per, "advantage": float(self._logs["advantages"][i])})
        groups = [rows[j:j + k] for j in range(0, len(rows) - k + 1, k)]
        group = max(groups, key=lambda grp: max(r["reward"] for r in grp) - min(r["reward"] for r in grp))
        ranked = sorted(group, key=lambda r: -r["reward"])
        picked = [ranked[j // 2] if j % 2 == 0 else ranked[-1 - j // 2] for j in range(len(ranked))]
        return picked[:count]


def _number(value) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _content(completion) -> str:
    """A completion's text: TRL keeps plain text, or [{"role": "assistant", "content": ...}] for chat prompts."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content") or "" for m in completion if isinstance(m, dict))


# -- events ------------------------------------------------------------------------------------------
def add_callbacks(trainer, cfg, writer, info: dict, rank: int) -> None:
    """Attach GRPO's sample/warning events (rank 0 writes)."""
    trainer.add_callback(GrpoEvents(writer, trainer, cfg, info, rank))


class GrpoEvents(TrainerCallback):
    """Per step: ``grpo.samples_per_step`` ``sample`` events (source "grpo"); once, a ``no_learning_signal``
    warning after ``grpo.no_signal_steps`` steps in a row where almost every group scored all answers the same;
    at the start, a ``skipped_lines`` warning for prompts skipped as too long."""

    def __init__(self, writer, trainer, cfg, info: dict, rank: int):
        self.writer, self.trainer, self.cfg, self.info, self.rank = writer, trainer, cfg, info, rank
        self.flat_steps, self.flat_rewards, self.warned = 0, [], False

    def on_train_begin(self, args, state, control, **kw):
        where = self.info.get("prompts_too_long_where") or []
        if self.rank == 0 and self.info.get("prompts_too_long"):
            g, d = self.cfg.grpo, self.cfg.data
            self.writer.emit(WarningEvent(code="skipped_lines", message=(
                f"left out {self.info['prompts_too_long']} prompt(s) of {d.path} longer than the "
                f"{d.seq_len - g.max_completion_length} tokens data.seq_len {d.seq_len} - grpo.max_completion_length "
                f"{g.max_completion_length} leaves (first: {', '.join(where[:5])})")))

    def on_log(self, args, state, control, logs=None, **kw):
        if self.rank != 0 or not logs or "loss" not in logs:
            return
        for s in self.trainer._tp_samples(self.cfg.grpo.samples_per_step):
            self.writer.emit(SampleEvent(step=state.global_step, prompt=s["prompt"], text=s["text"],
                                         tokens=s["tokens"], extra={"source": "grpo", "reward": s["reward"],
                                                                    "rewards": s["rewards"],
                                                                    "advantage": s["advantage"]}))
        self._watch_signal(logs.get("frac_reward_zero_std"), logs.get("reward"))

    def _watch_signal(self, flat, reward) -> None:
        if not isinstance(flat, (int, float)) or self.warned:
            return
        if flat < NO_SIGNAL_FRACTION:
            self.flat_steps, self.flat_rewards = 0, []
            return
        self.flat_steps += 1
        self.flat_rewards.append(reward)
        if self.flat_steps >= self.cfg.grpo.no_signal_steps:
            self.warned = True
            top = sum(max(0.0, w) for w in self.info.get("reward_weights") or [])
            self.writer.emit(WarningEvent(code="no_learning_signal", message=no_signal_message(
                self.flat_steps, flat, self.flat_rewards, top)))


def no_signal_message(steps: int, fraction: float, rewards: list, top: float | None = None) -> str:
    """The warning's text: how long, how many groups, and what they all scored. ``top``: the total reward of an answer
    every reward scores 1 (the sum of the positive weights); groups all at it have learned what the rewards ask."""
    known = [r for r in rewards if isinstance(r, (int, float))]
    mean = sum(known) / len(known) if known else None
    if mean is not None and top and mean >= 0.95 * top:
        return (f"for {steps} steps every answer in {fraction:.0%} of groups scored the same (mean reward {mean:.3g} of "
                f"{top:.3g}: the answers are right): the model does what the rewards ask, so more steps teach it "
                f"nothing; stop here, or train on harder prompts")
    if mean is None:
        what = "no reward could score the answers"
    elif mean == 0:
        what = "every answer scores 0"
    else:
        of = f" of {top:.3g}" if top else ""
        return (f"for {steps} steps every answer in {fraction:.0%} of groups scored the same (mean reward {mean:.3g}"
                f"{of}): no learning signal; the model may give the same answer every time (raise grpo.temperature "
                f"or grpo.num_generations), or the reward may not tell the answers apart (check it and "
                f"rewards.answer_field)")
    return (f"for {steps} steps every answer in {fraction:.0%} of groups scored the same ({what}): no learning "
            f"signal; check the reward (and rewards.answer_field) or start from an SFT model")
