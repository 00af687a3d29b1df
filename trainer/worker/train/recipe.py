"""The worker: one training process (one rank), started by the supervisor.

``python -m trainer.worker --run-dir DIR [--resume-from CHECKPOINT]`` reads ``DIR/config.yaml``
(already resolved: no 'auto' left), trains with HF's Trainer, writes events, and exits with
0 (finished or stopped on request), 2 (bad input), 3 (out of memory) or 1 (anything else).
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer import config as config_mod
from trainer.config.placements import hf_optim
from trainer.config.resolved import ResolvedRunConfig, load_resolved
from trainer.core import secrets
from trainer.core.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAULT,
    EXIT_OOM,
    TrainPilotError,
    UserError,
)
from trainer.launch.argv import ALLOCATOR_VARIABLE, allocator_env, rank_announcement, rank_environment
from trainer.rundir.checkpoints import engine_meta, latest_checkpoint, ranks_change, read_marker
from trainer.rundir.events import EVENTS_FILE, EventWriter
from trainer.rundir.records import (
    Failed,
    Finished,
    OomEvent,
    RunStarted,
    Stopped,
    WarningEvent,
)
from trainer.worker.loading import lean
from trainer.worker.train import trackers


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code. ``argv`` None: this process's own command line (``python -m
    trainer.worker``), which may leave unused libraries unimported (``lean``)."""
    if argv is None:
        lean.own_process()
    ap = argparse.ArgumentParser(prog="trainer.worker")
    ap.add_argument("--run-dir")
    ap.add_argument("--resume-from", default=None)
    ap.add_argument("--standby", action="store_true", help="import the training libraries, then read this "
                    "command's other arguments as one JSON list on stdin (end of input: exit 0 at once)")
    ap.add_argument("--without", default="", help="with --standby: optional libraries to leave unimported "
                    "(comma-separated; the run's read config never uses them)")
    args = ap.parse_args(argv)
    started_early = args.standby
    if started_early:
        lean.leave_unimported(args.without.split(","))
        rest = standby()
        if rest is None:
            return 0
        args = ap.parse_args(rest)
    if not args.run_dir:
        ap.error("--run-dir is required")
    run_dir = Path(args.run_dir)
    rank = int(os.environ.get("RANK", "0"))
    known = secrets.secret_values()  # read once: a keyring lookup per event would cost every step
    writer = EventWriter(run_dir / EVENTS_FILE, redact=functools.partial(secrets.redact, values=known))
    try:
        cfg = load_resolved(run_dir / "config.yaml")
        if not started_early:  # a standby has imported: what it left out is all it can (spawn.Standby.take)
            lean.for_run(cfg)
        if lean.left_out() and rank == 0:
            print(f"trainpilot worker: left unimported (this run never uses them): {', '.join(lean.left_out())}",
                  file=sys.stderr, flush=True)
        rank_environment(cfg)  # no process group for a lone plain worker (HF would wrap it in DDP)
        os.environ.update(allocator_env(os.environ))  # ranks a multi-node launcher started without our environment
        rank = int(os.environ.get("RANK", "0"))
        announced = rank_announcement(cfg)
        if announced:  # which rank is which process: the supervisor names the one that dies (supervisor.ranks)
            print(announced, file=sys.stderr, flush=True)
        return train(cfg, run_dir, writer, args.resume_from, rank)
    except config_mod.ConfigError as exc:
        return _fail(writer, rank, exc.render(), EXIT_BAD_INPUT, kind="bad_input")
    except TrainPilotError as exc:
        return _fail(writer, rank, str(exc), exc.exit_code, kind="bad_input" if exc.exit_code == 2 else "fault")
    except BaseException as exc:  # classify: out-of-memory, failed save, anything else
        return _classify(exc, writer, rank)


def standby() -> list[str] | None:
    """A worker started before its run folder exists (``trainer.supervisor.standby``): import what every run needs
    (torch, transformers' Trainer, this room's modules: most of a worker's start-up) while the CLI checks the inputs
    and plans, then wait for the arguments on stdin. None when stdin ends first (the CLI gave up: bad input, or it
    died): nothing was written anywhere."""
    import json

    import torch  # noqa: F401
    import transformers  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments  # noqa: F401

    from trainer.worker.datapipe import sequences  # noqa: F401
    from trainer.worker.kernels import chunked_loss  # noqa: F401
    from trainer.worker.loading import modeling  # noqa: F401
    from trainer.worker.train import engine_switch, evaluation, hf_glue, objectives  # noqa: F401

    line = sys.stdin.readline()
    return json.loads(line) if line.strip() else None


def _classify(exc: BaseException, writer: EventWriter, rank: int) -> int:
    from trainer.worker.train.hf_glue import CheckpointWriteError

    if is_oom(exc):  # an expected end the ladder recovers: one line, where it ran out, no traceback
        print(f"trainpilot worker: out of memory {_where(exc)}: {str(exc).splitlines()[0] if str(exc) else ''}",
              file=sys.stderr, flush=True)
        if rank == 0:
            phase = oom_phase(exc)  # GRPO: "sampling" or "update", for the ladder's choice of rung
            writer.emit(OomEvent(message=secrets.redact(str(exc).splitlines()[0] if str(exc) else "out of memory"),
                                 extra={"phase": phase} if phase else {}))
        return EXIT_OOM
    traceback.print_exc()  # full detail goes to train.log through the supervisor
    if isinstance(exc, CheckpointWriteError):
        return _fail(writer, rank, f"{exc}; the previous checkpoint is kept. Free disk space there, then "
                                   f"run 'trainpilot-cli resume'", EXIT_FAULT, kind="checkpoint_write")
    if isinstance(exc, KeyboardInterrupt):
        return _fail(writer, rank, "interrupted before training started", EXIT_FAULT, kind="interrupted")
    return _fail(writer, rank, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                 EXIT_FAULT, kind="fault")


def _where(exc: BaseException) -> str:
    """``in FUNCTION (FILE:LINE)``: the innermost frame the exception passed through."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f"in {last.name} ({Path(last.filename).name}:{last.lineno})"


def is_oom(exc: BaseException) -> bool:
    """True for CUDA/CPU out-of-memory errors (anywhere in the exception chain)."""
    seen = 0
    while exc is not None and seen < 8:
        text = str(exc).lower()
        if type(exc).__name__ == "OutOfMemoryError" or "out of memory" in text or isinstance(exc, MemoryError):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def oom_phase(exc: BaseException) -> str | None:
    """Where an out-of-memory error happened, when the trainer said (``tp_phase`` on the exception or its causes:
    GRPO's "sampling" or "update"); None otherwise."""
    seen = 0
    while exc is not None and seen < 8:
        if getattr(exc, "tp_phase", None):
            return exc.tp_phase
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _fail(writer: EventWriter, rank: int, message: str, code: int, kind: str) -> int:
    message = secrets.redact(message)
    print(f"trainpilot worker: {message}", file=sys.stderr)
    if rank == 0:
        writer.emit(Failed(message=message, exit_code=code, kind=kind))
    return code


def _layer_split(model) -> list | None:
    """Where the layers of a model split over cards sit (``distributed.layer_split``): per device, in order, its
    count of decoder layers, read off the loaded model's ``hf_device_map``; None for a model on one device."""
    placed = getattr(model, "hf_device_map", None) or getattr(getattr(model, "base_model", None), "hf_device_map", None)
    if not placed:
        return None
    from trainer.worker.loading.device_map import decoder_layers

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    path, n = decoder_layers(base)
    per: dict = {}
    for i in range(n):
        where = str(placed.get(f"{path}.{i}"))
        per[where] = per.get(where, 0) + 1
    return [{"device": d, "layers": k} for d, k in per.items()]


def train(cfg: ResolvedRunConfig, run_dir: Path, writer: EventWriter, resume_from: str | None, rank: int) -> int:
    """Set up, train, clean up. Returns the exit code."""
    from trainer.worker.train import engine_switch

    setup = _setup(cfg, run_dir, writer, rank)
    trainer, steps, info = setup.trainer, setup.steps, setup.data_info
    change = engine_switch.prepare(trainer, resume_from, cfg)  # a checkpoint of another engine (the OOM ladder's)
    ranks = ranks_change(read_marker(resume_from), cfg) if resume_from else None  # resumed on another GPU count
    if rank == 0:
        writer.emit(RunStarted(pid=os.getpid(), resume_from=resume_from, device=setup.device, precision=setup.precision,
                               world_size=int(os.environ.get("WORLD_SIZE", "1")), engine_change=change,
                               tokenizer=setup.tokenizer_check, ranks_change=ranks,
                               extra=dict(info, cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
                                          layer_split=_layer_split(trainer.model))))
        if ranks:
            print(f"trainpilot: {ranks['message']}", file=sys.stderr, flush=True)
        print(f"trainpilot: {setup.tokenizer_check['message']}", file=sys.stderr, flush=True)
        if info["skipped_lines"]:
            writer.emit(WarningEvent(code="skipped_lines",
                                     message=f"skipped {info['skipped_lines']} unreadable line(s) of {cfg.data.path} "
                                             f"(first: {info['skipped_line_numbers'][:5]})"))
        for code, message in setup.warnings:
            print(f"trainpilot: {message}", file=sys.stderr, flush=True)  # train.log says it too
            writer.emit(WarningEvent(code=code, message=message))
    trainer.train(resume_from_checkpoint=resume_from)
    code = _finish(cfg, run_dir, writer, trainer, steps, rank)
    trackers.finish(cfg, code)
    _close_process_group()
    return code


def _close_process_group() -> None:
    """Tear the process group down before the interpreter exits: gloo's threads still running at
    exit abort the process ("terminate called without an active exception", SIGABRT) now and then,
    which turned a finished two-rank run into a failed one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _finish(cfg, run_dir: Path, writer: EventWriter, trainer, steps, rank: int) -> int:

    state = trainer.state
    last = latest_checkpoint(run_dir / "checkpoints")
    if steps.stop_requested and state.global_step < state.max_steps:
        if rank == 0:
            writer.emit(Stopped(step=state.global_step, checkpoint=str(last) if last else None))
        return 0
    final = run_dir / "final"
    if cfg.checkpoints.save_final_model:
        trainer.save_model(str(final))
        if rank == 0 and trainer.processing_class is not None:
            trainer.processing_class.save_pretrained(str(final))
    fingerprint = _weights_fingerprint(trainer)
    if rank == 0:
        writer.emit(Finished(step=state.global_step, final=str(final) if cfg.checkpoints.save_final_model else None,
                             loss=next((h["loss"] for h in reversed(state.log_history) if "loss" in h), None),
                             extra={"wrapped_model": type(trainer.model_wrapped).__name__, **fingerprint}))
    return 0


def _weights_fingerprint(trainer) -> dict:
    """SHA-256 of this rank's trainable weights, gathered from every rank (a data-parallel sync check)."""
    import hashlib

    import torch

    h = hashlib.sha256()
    model = trainer.model_wrapped if trainer.is_deepspeed_enabled else trainer.model
    if trainer.is_deepspeed_enabled and trainer.args.deepspeed_plugin and trainer.args.deepspeed_plugin.zero_stage == 3:
        return {}  # ZeRO-3 shards the weights: each rank holds different slices by design
    for name, p in sorted(trainer.model.named_parameters()):
        if p.requires_grad:
            h.update(name.encode())
            h.update(p.detach().float().cpu().numpy().tobytes())
    mine = h.hexdigest()
    if trainer.args.world_size > 1:
        every = [None] * trainer.args.world_size
        torch.distributed.all_gather_object(every, mine)
    else:
        every = [mine]
    del model
    return {"weights_sha256": every[0], "ranks_weights_sha256": every, "ranks_in_sync": len(set(every)) == 1}


@dataclass
class WorkerSetup:
    """What one worker trains with, built once by ``_setup`` (the recipe's set-up step)."""

    trainer: Any  # TrainPilotTrainer (HF Trainer)
    steps: Any  # StepEvents callback: step events and the graceful-stop check
    data_info: dict  # what the data pipeline reports (sequences, tokens, skipped lines)
    device: str  # cuda | cpu
    precision: str  # bf16 | fp16 | fp32
    warnings: list  # (code, message): what the run leaves as it is (model_parts.part_warnings, tokenizer_check)
    tokenizer_check: dict  # the tokenizer against the model's own files (tokenizer_check.report)


def _setup(cfg: ResolvedRunConfig, run_dir: Path, writer: EventWriter, rank: int) -> WorkerSetup:
    import torch

    from trainer.worker.train import evaluation
    from trainer.worker.kernels import chunked_loss
    from trainer.worker.loading import model_parts, modeling, tokenizer_check
    from trainer.worker.train import objectives
    from trainer.worker.datapipe import sequences
    from trainer.worker.datapipe import vision_inputs as vision
    from trainer.worker.train.hf_glue import INJECT_CPU_OFFLOAD_ENV, StepEvents, TrainPilotTrainer
    from trainer.worker.train.step_output import PacedOutput

    use_cuda = cfg.device == "cuda"
    if cfg.speed.activation_offload is True and not use_cuda and os.environ.get(INJECT_CPU_OFFLOAD_ENV) != "1":
        raise UserError("speed.activation_offload: offloading moves activations from the GPU to host RAM; on the CPU "
                        "there is nothing to offload: set speed.activation_offload: false (or auto)",
                        field="speed.activation_offload")
    if use_cuda and not torch.cuda.is_available():
        raise UserError("device: the config says cuda but PyTorch sees no CUDA GPU; run 'trainpilot-cli doctor', "
                        "or set device: cpu", field="device")
    if cfg.method.type == "qlora" and not use_cuda:
        raise UserError("method.type: QLoRA needs an NVIDIA GPU (bitsandbytes 4-bit is CUDA-only); use lora on "
                        "this machine", field="method.type")
    precision = cfg.speed.precision
    if use_cuda and cfg.speed.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    os.environ["TENSORBOARD_LOGGING_DIR"] = str(run_dir / "tensorboard")
    if cfg.deepspeed.enabled is not True:
        _no_deepspeed_import()
    tokenizer = modeling.load_tokenizer(cfg)
    started = time.time()
    if objectives.handles(cfg):  # DPO/KTO/ORPO/GRPO through TRL, encoder-decoder models
        make_args = functools.partial(_training_arguments, cfg, run_dir, precision, use_cuda)
        trainer, info = objectives.build_trainer(cfg, tokenizer, precision, use_cuda, make_args,
                                                 _checkpoint_meta(cfg))
    else:
        pictures = vision.pictures_for(cfg, tokenizer)  # a vision-language model's processor, else None
        train_ds, eval_ds, info = sequences.build_datasets(cfg, tokenizer, pictures)
        corpus_vocab = len(tokenizer) if cfg.model.tokenizer == "corpus" else None
        if corpus_vocab and rank == 0:
            tokenizer.save_pretrained(str(run_dir / "tokenizer"))  # the run keeps the tokenizer it trained
        model = modeling.load_model(cfg, precision, use_cuda, vocab_size=corpus_vocab)
        info["loss_kernel"] = chunked_loss.install_kernel(model, cfg, "cuda" if use_cuda else "cpu")
        targs = _training_arguments(cfg, run_dir, precision, use_cuda, use_liger_kernel=info["loss_kernel"] == "liger")
        collator = (sequences.PictureCollator(tokenizer.pad_token_id, pictures) if info["pictures"] else
                    sequences.Collator(tokenizer.pad_token_id))
        trainer = TrainPilotTrainer(model=model, args=targs, train_dataset=train_ds, eval_dataset=eval_ds,
                                    data_collator=collator, processing_class=tokenizer,
                                    keep_last=cfg.checkpoints.keep_last, run_meta=_checkpoint_meta(cfg),
                                    shuffle=cfg.data.shuffle)
        if pictures is not None:
            pictures.processor.chat_template = tokenizer.chat_template  # the template trained with is the one saved
            trainer.tp_processor = pictures.processor
    if cfg.speed.activation_offload is True:
        trainer._tp_offload_activations(cfg.speed.gradient_checkpointing is True)
    info.update(_kernel_info(cfg, trainer.model, use_cuda))
    info["data_seconds"] = round(time.time() - started, 3)  # load + tokenize + pack (or open the cache), or TRL's
    trainer.tp_optimizer_in_backward = cfg.training.optimizer_in_backward is True
    if not trainer.is_deepspeed_enabled:  # built now (HF's train() keeps it): run_started says what was built
        trainer.create_optimizer()
    info["optimizer_step"] = trainer._tp_optimizer_step()
    steps = StepEvents(writer, run_dir, trainer, cfg.training.effective_batch_size)
    trainer.add_callback(steps)
    trainer.add_callback(PacedOutput())  # the per-step log lines reach train.log once a second, not a pipe write a step
    if objectives.handles(cfg):
        objectives.add_callbacks(trainer, cfg, writer, info, rank)
    evaluation.add_callbacks(trainer, cfg, writer, tokenizer, rank)
    trainer.tp_companion_files = model_parts.companion_files(cfg, trainer.model,
                                                            getattr(trainer, "tp_processor", None) is not None)
    checked = tokenizer_check.report(tokenizer, cfg)
    return WorkerSetup(trainer=trainer, steps=steps, data_info=info, device="cuda" if use_cuda else "cpu",
                       precision=precision, tokenizer_check=checked,
                       warnings=model_parts.part_warnings(cfg, trainer.model) + tokenizer_check.warning_events(checked))


def _kernel_info(cfg, model, use_cuda: bool) -> dict:
    """What run_started says about the memory kernels: the tiled blocks, what activation offload moves, and the CUDA
    allocator's setting this worker runs with (None on the CPU)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    offload = None
    if cfg.speed.activation_offload is True:
        offload = "checkpoint_inputs" if cfg.speed.gradient_checkpointing is True else "saved_activations"
    return {"tiled_blocks": getattr(base, "tp_tiled_blocks", 0), "activation_offload": offload,
            "cuda_alloc_conf": os.environ.get(ALLOCATOR_VARIABLE) if use_cuda else None}


def _no_deepspeed_import() -> None:
    """A run without DeepSpeed does not import it. accelerate's ``extract_model_from_parallel`` (every
    ``unwrap_model``: Trainer set-up, saving) imports ``deepspeed`` whenever it is installed, only to
    test ``isinstance(model, DeepSpeedEngine)``; that import costs 2-3 s of every run's start (deepspeed
    pulls in its autotuner, and mlflow through it). No model here is a DeepSpeedEngine, so accelerate is
    told deepspeed is absent for this process. Harmless if accelerate renames it: the import then simply
    happens again (tests/test_data_blocks.py checks that it does not)."""
    from accelerate.utils import other

    if "deepspeed" not in sys.modules and hasattr(other, "is_deepspeed_available"):
        other.is_deepspeed_available = lambda: False


def _checkpoint_meta(cfg) -> dict:
    """What each checkpoint's marker records: the batch geometry and the engine (``checkpoints.engine_meta``)."""
    t = cfg.training
    return {"micro_batch_size": t.micro_batch_size, "gradient_accumulation_steps": t.gradient_accumulation_steps,
            "effective_batch_size": t.effective_batch_size, **engine_meta(cfg)}


def _training_arguments(cfg, run_dir: Path, precision: str, use_cuda: bool, cls=None, **extra):
    """HF TrainingArguments (or ``cls``, a subclass such as TRL's DPOConfig, with ``extra`` fields) for the run."""
    from transformers import TrainingArguments

    cls = cls or TrainingArguments
    t, s = cfg.training, cfg.speed
    ds_path = run_dir / "ds_config.json"
    # training.optimizer → HF's ``optim`` (config.placements; None: PyTorch's AdamW, its fused kernel when
    # speed.fused_adamw on CUDA). The fused step takes the same class per parameter.
    optim = hf_optim(t.optimizer, bool(s.fused_adamw), use_cuda)
    eval_on = bool(t.eval_every_steps)
    return cls(
        output_dir=str(run_dir / "checkpoints"),
        per_device_train_batch_size=t.micro_batch_size, per_device_eval_batch_size=t.micro_batch_size,
        gradient_accumulation_steps=t.gradient_accumulation_steps,
        max_steps=t.max_steps or -1, num_train_epochs=t.epochs,
        learning_rate=t.learning_rate, lr_scheduler_type=t.lr_scheduler, warmup_steps=t.warmup_steps,
        weight_decay=t.weight_decay, max_grad_norm=t.max_grad_norm, optim=optim,
        seed=t.seed, data_seed=t.seed,
        bf16=precision == "bf16", fp16=precision == "fp16", tf32=bool(s.tf32 and use_cuda) or None,
        gradient_checkpointing=s.gradient_checkpointing is True,
        gradient_checkpointing_kwargs={"use_reentrant": False} if s.gradient_checkpointing is True else None,
        torch_compile=s.torch_compile,
        logging_steps=1, logging_first_step=True, report_to=(["tensorboard"] if cfg.output.tensorboard else []) + trackers.prepare(cfg),
        run_name=run_dir.name,
        save_strategy="steps", save_steps=cfg.checkpoints.every_steps, save_total_limit=None, save_only_model=False,
        # several machines without DeepSpeed: each machine's first rank writes the whole checkpoint into its own run
        # folder (no shared filesystem needed), so every machine resumes from its own (docs/multi-node.md). ZeRO's
        # shards are each rank's own: its checkpoints are not written per machine (DeepSpeed's node-local storage).
        save_on_each_node=cfg.distributed.num_nodes > 1 and cfg.deepspeed.enabled is not True,
        eval_strategy="steps" if eval_on else "no", eval_steps=t.eval_every_steps if eval_on else None,
        dataloader_num_workers=cfg.data.num_workers, remove_unused_columns=False,
        deepspeed=str(ds_path) if cfg.deepspeed.enabled is True else None,
        use_cpu=not use_cuda, ddp_backend="gloo" if not use_cuda and int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        disable_tqdm=True, **extra,
    )


if __name__ == "__main__":
    sys.exit(main())
