"""Worker side: our additions to HF's Trainer.

- ``TrainPilotTrainer``: counts real tokens per micro-batch, writes checkpoints aside and renames them
  into place (a killed worker never leaves a half-written ``checkpoint-N``), keeps the newest K,
  and can inject out-of-memory for tests of the recovery ladder.
- ``StepEvents``: one ``step`` event per optimizer step, and the graceful-stop check every step.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import os
import shutil
import signal
import time
from pathlib import Path

import torch
from transformers import Trainer, TrainerCallback

from trainer.config import placements
from trainer.rundir.checkpoints import (
    MARKER,
    complete_checkpoints,
    fsync_tree,
    staging_dir,
)
from trainer.rundir import stopfile
from trainer.rundir.records import CheckpointSaved, EvalEvent, StepEvent, StopRequested
from trainer.worker.datapipe.sequences import REAL_TOKENS_KEY
from trainer.worker.loading import in_backward_step
from trainer.worker.train.step_metrics import objective_fields, trl_eval_keys

# "STEP:MIN_MICRO[:NEEDS]": raise OOM at optimizer step >= STEP while micro > MIN_MICRO, or while the run lacks what
# NEEDS names: "chunked" (HF's full-logits loss runs), "deepspeed" (plain PyTorch), "zero3" (not ZeRO-3), "fused" (the
# optimizer step runs after backward, not in it);
# "+STEP" counts from the step each attempt starts at (so each attempt trains, and checkpoints, before its OOM).
# "STEP:MIN_GEN:sampling": GRPO only, OOM while sampling as long as grpo.generation_batch_size > MIN_GEN (raised by
# grpo.TrainPilotGRPOTrainer)
INJECT_OOM_ENV = "TRAINPILOT_INJECT_OOM"
INJECT_DISK_FULL_ENV = "TRAINPILOT_INJECT_DISK_FULL"  # "STEP": fail the checkpoint save at that step with ENOSPC
# "STEP": request a graceful stop at that step (as the STOP file would); "STEP:RANK": on that rank alone (as a signal to
# one rank would): the ranks agree to stop at one step (``StepEvents._should_stop``)
INJECT_STOP_ENV = "TRAINPILOT_INJECT_STOP"
INJECT_SLOW_SAVE_ENV = "TRAINPILOT_INJECT_SLOW_SAVE"  # "SECONDS": pause mid-save, so tests can kill -9 during it
# "1": on a CPU run, speed.activation_offload with checkpointing stashes the checkpoint inputs as host copies (a CPU has
# no device memory to free: this exists so tests can drive the offloaded checkpoints through HF's Trainer)
INJECT_CPU_OFFLOAD_ENV = "TRAINPILOT_INJECT_CPU_OFFLOAD"
# "RANK:STEP": the rank RANK (global) kills itself with SIGKILL as optimizer step STEP begins (its checkpoints up to
# STEP-1 are complete), as a machine or a process would die: tests of several ranks supervised as one run
INJECT_KILL_RANK_ENV = "TRAINPILOT_INJECT_KILL_RANK"


class TrainPilotMixin:
    """Our additions, for HF's Trainer and for TRL's trainers (which subclass it): real-token counting,
    atomic checkpoints and fault injection. Put it first in the bases: ``class X(TrainPilotMixin, DPOTrainer)``."""

    def __init__(self, *args, run_meta: dict | None = None, keep_last: int = 3, shuffle: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.tp_shuffle = shuffle
        self.tp_tokens = 0  # real tokens seen by this rank since the last step event
        self.tp_meta = run_meta or {}
        self.tp_keep_last = keep_last
        self._inject_oom = _parse_inject(os.environ.get(INJECT_OOM_ENV))
        self._inject_kill = _parse_kill(os.environ.get(INJECT_KILL_RANK_ENV))
        self._tp_first_step = None  # the optimizer step this attempt started at (a resume's checkpoint step)
        self._tp_offload = contextlib.nullcontext()
        self.tp_engine_switch = None  # engine_switch.EngineSwitch: a checkpoint of another engine to resume
        self.tp_companion_files: list[Path] = []  # saved beside every model (tokenizer.model, processor files)
        self.tp_processor = None  # a vision-language model's processor (its image settings, the run's tokenizer)
        self.tp_optimizer_in_backward = False  # training.optimizer_in_backward: the step runs in backward (in_backward_step)
        self._tp_flop_params = None  # (model, its non-embedding parameter count): floating_point_ops' factor

    def floating_point_ops(self, inputs):
        """HF's estimate (6 × input tokens × non-embedding parameters, summed into ``total_flos``) with the parameter
        count taken once per model: HF's walks every module and parameter on every micro-batch (1 ms of a 45 ms CPU
        demo step, profiled)."""
        main = getattr(self.model, "main_input_name", "input_ids")
        if main not in inputs or not hasattr(self.model, "num_parameters"):
            return 0
        if self._tp_flop_params is None or self._tp_flop_params[0] is not self.model:
            self._tp_flop_params = (self.model, self.model.num_parameters(exclude_embeddings=True))
        return 6 * inputs[main].numel() * self._tp_flop_params[1]

    def _tp_offload_activations(self, checkpointing: bool) -> None:
        """``speed.activation_offload``: every training step runs in ``offloaded_checkpoint.offload_context`` (with
        checkpointing, the checkpointed layer inputs kept in pinned host RAM; without, TRL's activation offloading)."""
        from trainer.worker.kernels.offloaded_checkpoint import offload_context

        host_copies = os.environ.get(INJECT_CPU_OFFLOAD_ENV) == "1" and checkpointing
        self._tp_offload = offload_context(self.model, checkpointing, host_copies=host_copies)

    def training_step(self, model, inputs, num_items_in_batch=None):
        """One micro-batch forward/backward (count its real tokens first)."""
        self.tp_tokens += _real_tokens(inputs)
        if self._tp_first_step is None:
            self._tp_first_step = self.state.global_step
        if self._inject_kill and self.state.global_step + 1 >= self._inject_kill[1] and \
                self.args.process_index == self._inject_kill[0]:
            os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))  # Windows has no SIGKILL
        if self._inject_oom and self.state.global_step + 1 >= self._tp_oom_step() and self._tp_oom_now(model):
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected by {INJECT_OOM_ENV} at step "
                                         f"{self.state.global_step + 1}, micro-batch {self.args.per_device_train_batch_size})")
        with self._tp_offload:
            return super().training_step(model, inputs, num_items_in_batch)

    def _tp_oom_step(self) -> int:
        """The optimizer step from which the injected OOM is raised (``+STEP``: counted from this attempt's start)."""
        step, relative = self._inject_oom[0], self._inject_oom[3]
        return step + ((self._tp_first_step or 0) if relative else 0)

    def _tp_oom_now(self, model) -> bool:
        """The injected OOM's condition: micro-batch above the floor, or the run lacks what NEEDS names."""
        _, floor, needs, _ = self._inject_oom
        if needs == "sampling":  # GRPO's sampling phase raises it (grpo.py), not the update
            return False
        if self.args.per_device_train_batch_size > floor:
            return True
        if needs == "chunked":
            base = self.accelerator.unwrap_model(model)
            base = base.get_base_model() if hasattr(base, "get_base_model") else base
            return getattr(base, "tp_loss_kernel", "hf") == "hf"  # HF's full-logits loss
        return {"deepspeed": not self.tp_meta.get("deepspeed"), "zero3": self.tp_meta.get("zero_stage") != 3,
                "fused": not self.tp_optimizer_in_backward}.get(needs, False)

    def _prepare_for_training(self, max_steps, train_dataloader, resume_from_checkpoint):
        """HF's set-up (engine, optimizer, scheduler, then its own resume). A checkpoint another engine wrote is not
        given to HF's loader, which reads only its engine's format (DeepSpeed: "Can't find a valid checkpoint"):
        ``engine_switch.restore`` carries its state across once the engine exists. HF still resumes the data
        position and random state from it (``train`` passes the checkpoint on to those steps)."""
        switch = self.tp_engine_switch
        if switch is None or resume_from_checkpoint is None:
            return super()._prepare_for_training(max_steps, train_dataloader, resume_from_checkpoint)
        from trainer.worker.train import engine_switch

        model, loader = super()._prepare_for_training(max_steps, train_dataloader, None)
        engine_switch.restore(self, switch)
        return model, loader

    # -- the optimizer step fused into backward (in_backward_step): HF builds its optimizer, each parameter gets its own --
    def create_optimizer(self, model=None):
        created = self.optimizer is None
        optimizer = super().create_optimizer(model)
        if self.tp_optimizer_in_backward and created:
            self.optimizer = optimizer = in_backward_step.InBackwardStep(optimizer)
        return optimizer

    def _tp_optimizer_step(self) -> dict:
        """What ``run_started`` says of the optimizer step, read from the optimizer ``create_optimizer`` built (not
        from the config): ``step`` fused (``InBackwardStep``, its hook on every trained parameter) or separate, ``states``
        (training.optimizer's name for what the built class keeps: the placement table's row,
        ``trainer.config.placements``), ``paged`` (bitsandbytes' managed memory) and ``optimizer`` (the class). Under DeepSpeed,
        whose engine builds its own optimizer as training starts: separate, states "deepspeed"."""
        if self.optimizer is None and self.is_deepspeed_enabled:
            return {"step": "separate", "states": "deepspeed", "paged": False, "optimizer": None}
        fused = in_backward_step.of(self.optimizer)
        if fused is not None and fused.unhooked():
            raise RuntimeError(f"the optimizer step fused into backward has no hook on {len(fused.unhooked())} "
                               f"trained parameter(s): they would never be updated")
        built = fused.layout if fused is not None else getattr(self.optimizer, "optimizer", self.optimizer)
        paged = bool(getattr(built, "is_paged", False))
        bits = getattr(getattr(built, "args", None), "optim_bits", 32) if hasattr(built, "is_paged") else None
        states = placements.find(paged=paged, eight_bit=bits == 8).name
        return {"step": "fused" if fused is not None else "separate", "states": states, "paged": paged,
                "optimizer": f"{type(built).__module__.split('.')[0]}.{type(built).__name__}"}

    def create_scheduler(self, num_training_steps, optimizer=None):
        """One schedule for every parameter: on the fused step's layout (HF's own groups), not per parameter."""
        fused = in_backward_step.of(optimizer if optimizer is not None else self.optimizer)
        return super().create_scheduler(num_training_steps, fused.layout if fused else optimizer)

    def _get_grad_norm(self, model, grad_norm=None):
        """The fused step measured the whole gradient as its hooks freed it (HF's would find no gradients: 0)."""
        fused = in_backward_step.of(self.optimizer)
        return fused.take_grad_norm() if fused else super()._get_grad_norm(model, grad_norm)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Evaluation step (drop our token count key; GRPO's batches are lists of prompt records)."""
        if not isinstance(inputs, list):
            inputs.pop(REAL_TOKENS_KEY, None)
        return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)

    def _save(self, output_dir=None, state_dict=None):
        """HF's save of the model and tokenizer (final/, checkpoints), and the files that go with the model."""
        super()._save(output_dir, state_dict)
        out = Path(output_dir or self.args.output_dir)
        if self.args.save_on_each_node and self.args.should_save and not self.is_world_process_zero():
            self._tp_save_weights_here(out, state_dict)
        for f in self.tp_companion_files:
            shutil.copyfile(f, out / f.name)
        if self.tp_processor is not None:  # after the copies: the run's own settings (image_max_pixels, template) win
            self.tp_processor.save_pretrained(str(out))

    def _tp_save_weights_here(self, out: Path, state_dict) -> None:
        """The weights and model config on another machine's first rank (``save_on_each_node``: several machines, each
        resuming from its own run folder). transformers 5.23's ``save_pretrained`` writes only on global rank 0
        (``should_save_on_this_rank``), whatever ``is_main_process`` says: asked here for this one call."""
        model = self.accelerator.unwrap_model(self.model, keep_torch_compile=False)
        if not hasattr(model, "save_pretrained"):
            return
        model.should_save_on_this_rank = lambda is_main_process: is_main_process
        try:
            model.save_pretrained(str(out), state_dict=state_dict, is_main_process=True)
        finally:
            del model.should_save_on_this_rank

    # -- checkpoints: written aside, fsynced, renamed into place ----------------------------------
    def _get_output_dir(self, trial):
        staging = getattr(self, "_tp_staging", None)
        return staging or super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial):
        step = self.state.global_step
        root = Path(self.args.output_dir)
        final = root / f"checkpoint-{step}"
        stage = staging_dir(root, step)
        started = time.time()
        if self.args.should_save:
            shutil.rmtree(stage, ignore_errors=True)
            stage.mkdir(parents=True, exist_ok=True)
        if self.args.world_size > 1:
            self.args.distributed_state.wait_for_everyone()
        self._tp_staging = str(stage)
        try:
            self._tp_save_into(stage, step, model, trial)
        except OSError as exc:
            if self.args.should_save:
                shutil.rmtree(stage, ignore_errors=True)
            raise CheckpointWriteError(step, final, exc) from exc
        finally:
            self._tp_staging = None
        if self.args.world_size > 1:
            self.args.distributed_state.wait_for_everyone()
        if self.args.should_save:
            self._tp_publish(stage, final, step, started)
        if self.args.world_size > 1:
            self.args.distributed_state.wait_for_everyone()

    def _tp_save_into(self, stage: Path, step: int, model, trial) -> None:
        disk_full_at = os.environ.get(INJECT_DISK_FULL_ENV)
        if disk_full_at and int(disk_full_at) == step:
            raise OSError(errno.ENOSPC, "No space left on device (injected)", str(stage))
        super()._save_checkpoint(model, trial)
        pause = float(os.environ.get(INJECT_SLOW_SAVE_ENV) or 0)
        if pause:
            time.sleep(pause)  # the weights are written, the marker is not: the worst moment to die

    def _get_train_sampler(self, train_dataset=None):
        order = getattr(train_dataset if train_dataset is not None else self.train_dataset, "order", None)
        if order is not None:  # blocks.Blocks: its own order (epoch 0 as tokenized, then seeded permutations)
            return order
        if not self.tp_shuffle:
            return torch.utils.data.SequentialSampler(train_dataset if train_dataset is not None else self.train_dataset)
        return super()._get_train_sampler(train_dataset)

    def _tp_publish(self, stage: Path, final: Path, step: int, started: float) -> None:
        # HF wrote into <stage>/checkpoint-N; move that up as the checkpoint's content.
        inner = stage / f"checkpoint-{step}"
        meta = dict(self.tp_meta, step=step, time=time.time())
        (inner / MARKER).write_text(json.dumps(meta, indent=2))
        fsync_tree(inner)
        if final.exists():  # a re-save of the same step (after resume): replace it whole
            shutil.rmtree(final)
        os.replace(inner, final)
        shutil.rmtree(stage, ignore_errors=True)
        _fsync_dir(final.parent)
        self.tp_last_checkpoint = (final, time.time() - started)
        keep_also = getattr(self, "tp_keep_also", None)  # early stopping's best checkpoint
        for old in complete_checkpoints(final.parent)[: -self.tp_keep_last]:
            if keep_also is None or Path(old) != Path(keep_also):
                shutil.rmtree(old, ignore_errors=True)


class TrainPilotTrainer(TrainPilotMixin, Trainer):
    """HF Trainer with real-token counting, atomic checkpoints and fault injection."""


def _real_tokens(inputs: dict) -> int:
    """Our collators count real tokens under REAL_TOKENS_KEY; TRL's batches carry attention masks
    (chosen and rejected rows of a DPO pair, KTO's KL rows are not trained so not counted)."""
    if isinstance(inputs, list):  # GRPO's prompt records: its trainer counts what it trains (grpo.py)
        return 0
    if REAL_TOKENS_KEY in inputs:
        return int(inputs.pop(REAL_TOKENS_KEY))
    masks = [inputs["attention_mask"]] if "attention_mask" in inputs else \
        [inputs[k] for k in ("chosen_attention_mask", "rejected_attention_mask") if k in inputs]  # ORPO's batch
    return sum(int(m.sum()) for m in masks)


class CheckpointWriteError(Exception):
    """Saving a checkpoint failed (disk full, permissions); the previous checkpoints are kept."""

    def __init__(self, step: int, path: Path, cause: OSError):
        self.step, self.path, self.cause = step, path, cause
        what = "disk full" if cause.errno == errno.ENOSPC else (cause.strerror or str(cause))
        super().__init__(f"{what} while saving the checkpoint of step {step} in {path.parent}")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # Windows cannot open folders; rename is durable there once the files are flushed
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _parse_inject(value: str | None) -> tuple[int, int, str, bool] | None:
    """``[+]STEP:MIN_MICRO[:NEEDS]`` → (step, micro-batch floor, NEEDS or "", counted from the attempt's start)."""
    if not value:
        return None
    step, _, rest = value.partition(":")
    micro, _, needs = rest.partition(":")
    return int(step.lstrip("+")), int(micro or 0), needs, step.startswith("+")


def _parse_kill(value: str | None) -> tuple[int, int] | None:
    """``RANK:STEP`` → (global rank, optimizer step)."""
    if not value:
        return None
    rank, _, step = value.partition(":")
    return int(rank), int(step)


class StepEvents(TrainerCallback):
    """Writes ``step`` events (docs/design.md, "Events"; rank 0) and requests a graceful stop when asked."""

    def __init__(self, writer, run_dir: Path, trainer: TrainPilotTrainer, effective_batch: int):
        self.writer, self.run_dir, self.trainer = writer, run_dir, trainer
        self.effective_batch = effective_batch
        self.stop_requested = False
        self.stop_reason = None
        self._t0 = None
        self._ema = None
        self._pending = None
        self._world = 1  # ranks (HF's args.world_size asks accelerate's state on every read): set when training begins
        self._cuda = torch.cuda.is_available()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                signal.signal(sig, self._on_signal)
            except (ValueError, OSError):
                pass

    def _on_signal(self, signum, frame):
        self.stop_requested, self.stop_reason = True, signal.Signals(signum).name

    def on_train_begin(self, args, state, control, **kw):
        self._t0 = time.perf_counter()
        self._world = args.world_size

    def on_step_end(self, args, state, control, **kw):
        now = time.perf_counter()
        seconds, self._t0 = now - (self._t0 or now), now
        tokens = self._global_tokens(args)
        self._ema = seconds if self._ema is None else 0.7 * self._ema + 0.3 * seconds
        self._pending = StepEvent(step=state.global_step, max_steps=state.max_steps, epoch=state.epoch,
                                  step_seconds=seconds, tokens_per_second=tokens / seconds if seconds > 0 else None,
                                  samples_per_second=self.effective_batch / seconds if seconds > 0 else None,
                                  micro_batch_size=args.per_device_train_batch_size,
                                  gradient_accumulation_steps=args.gradient_accumulation_steps,
                                  eta_seconds=max(0, state.max_steps - state.global_step) * self._ema,
                                  **_cuda_memory(self._cuda))
        if self._should_stop(args):
            if not control.should_training_stop:
                control.should_save = True
            control.should_training_stop = True
            if state.is_world_process_zero and self.stop_reason != "reported":
                self.writer.emit(StopRequested(step=state.global_step, source=self.stop_reason or "STOP file"))
                self.stop_reason = "reported"
        return control

    def on_log(self, args, state, control, logs=None, **kw):
        if not self._pending or logs is None or "loss" not in logs or not state.is_world_process_zero:
            return
        event = dataclasses.replace(self._pending, loss=logs.get("loss"), learning_rate=logs.get("learning_rate"),
                                    grad_norm=logs.get("grad_norm"), extra=objective_fields(logs).fields())
        self._pending = None
        self.writer.emit(event)

    def on_save(self, args, state, control, **kw):
        saved = getattr(self.trainer, "tp_last_checkpoint", None)
        if saved and state.is_world_process_zero:
            path, secs = saved
            self.writer.emit(CheckpointSaved(step=state.global_step, path=str(path), seconds=secs,
                                             bytes=sum(f.stat().st_size for f in path.rglob("*") if f.is_file())))

    def on_evaluate(self, args, state, control, metrics=None, **kw):
        """An ``eval`` event: the validation loss and perplexity; GRPO's validation rewards instead of its loss (a
        policy-gradient term, not a measure of quality), typed as ``ObjectiveMetrics``."""
        if not state.is_world_process_zero or not metrics:
            return
        numbers = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        objective = objective_fields(numbers, prefix="eval_")
        rest = {k: v for k, v in numbers.items() if k not in trl_eval_keys(numbers) and k != "eval_loss"}
        if objective.reward is not None:  # GRPO: sampled and scored
            fields = objective.fields()
            self.writer.emit(EvalEvent(step=state.global_step, reward=fields.pop("reward"),
                                       reward_std=fields.pop("reward_std", None), rewards=fields.pop("rewards", None),
                                       extra={**fields, **rest}))
            return
        loss = numbers.get("eval_loss")
        perplexity = math.exp(min(loss, 700.0)) if loss is not None else None  # 700: no overflow
        self.writer.emit(EvalEvent(step=state.global_step, eval_loss=loss, perplexity=perplexity,
                                   extra={**objective.fields(), **rest}))

    def _global_tokens(self, args) -> int:
        tokens, self.trainer.tp_tokens = self.trainer.tp_tokens, 0
        if self._world > 1:
            t = torch.tensor([tokens], dtype=torch.long, device=args.device)
            torch.distributed.all_reduce(t)
            tokens = int(t.item())
        return tokens

    def _should_stop(self, args) -> bool:
        inject, _, only = (os.environ.get(INJECT_STOP_ENV) or "").partition(":")
        here = not only or int(only) == int(os.environ.get("RANK", "0"))
        if inject and here and self.trainer.state.global_step >= int(inject) and not self.stop_reason:
            self.stop_requested, self.stop_reason = True, INJECT_STOP_ENV
        local = self.stop_requested or stopfile.stop_requested(self.run_dir)
        if local and not self.stop_reason:
            self.stop_requested, self.stop_reason = True, "STOP file"
        if self._world > 1:  # every rank must stop at the same step, or the collectives hang
            flag = torch.tensor([1 if local else 0], device=args.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            if flag.item() and not local:  # asked on another rank (its signal, its injection): say so
                self.stop_reason = self.stop_reason or "another rank"
            local = bool(flag.item())
            self.stop_requested = self.stop_requested or local
        return local


def _cuda_memory(cuda: bool) -> dict:
    if not cuda:
        return {"gpu_memory_allocated_bytes": None, "gpu_memory_reserved_bytes": None, "gpu_memory_peak_bytes": None}
    return {"gpu_memory_allocated_bytes": torch.cuda.memory_allocated(),
            "gpu_memory_reserved_bytes": torch.cuda.memory_reserved(),
            "gpu_memory_peak_bytes": torch.cuda.max_memory_reserved()}
