"""Resuming a checkpoint that another engine wrote: plain PyTorch ↔ DeepSpeed, another ZeRO stage, another optimizer.

HF's Trainer reads only its engine's own format on resume: under DeepSpeed only a DeepSpeed checkpoint
(``deepspeed_load_checkpoint``: "Can't find a valid checkpoint"), without it only ``optimizer.pt``; DeepSpeed reads only
its own stage's layout. The OOM ladder moves a run from plain PyTorch to ZeRO-2 and from ZeRO-2 to ZeRO-3, so the
worker carries the state across itself (``trainer.rundir.checkpoints.engine_change`` says what carries):

- weights: loaded into the model before the engine is built (HF's own ``_load_from_checkpoint``: full weights or the
  LoRA adapter), so DeepSpeed builds its fp32 master copy from them; a DeepSpeed checkpoint's own fp32 masters are
  then set exactly (``safe_set_full_fp32_param``);
- AdamW moments and step count, per parameter: read from ``optimizer.pt`` (plain) or from DeepSpeed's universal
  checkpoint (``ds_to_universal``: per-parameter fp32, exp_avg, exp_avg_sq), written into the new engine's optimizer
  (DeepSpeed's ``safe_set_full_optimizer_state``, or the torch optimizer's state);
- the learning-rate schedule (``scheduler.pt``, or the DeepSpeed checkpoint's ``lr_scheduler``);
- the data position and random state: HF's own resume (``trainer_state.json``, ``rng_state.pth``), engine-agnostic.

8-bit optimizer states (bitsandbytes) do not convert to or from 32-bit AdamW's: the moments restart from zero then.
"""
from __future__ import annotations

import glob
import math
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from trainer.rundir.checkpoints import engine_change, read_marker
from trainer.worker.loading import lean


@dataclass
class EngineSwitch:
    """A resume across engines: the checkpoint, its marker, and what carries (``engine_change``)."""

    checkpoint: Path
    marker: dict
    change: dict

    def moments_carry(self) -> bool:
        """Whether the AdamW moments carry over (both sides 32-bit AdamW)."""
        return not any(line.startswith("optimizer moments") for line in self.change["not_carried"])


def prepare(trainer, resume_from: str | None, cfg) -> dict | None:
    """Before ``trainer.train``: when ``resume_from`` was written by another engine, load its weights into the model
    (DeepSpeed builds its copies from them) and mark the trainer so the optimizer state follows once the engine exists
    (``TrainPilotMixin._prepare_for_training`` calls ``restore``). Returns the ``engine_change`` (None: same engine,
    the library's own resume)."""
    if not resume_from:
        return None
    marker = read_marker(resume_from)
    change = engine_change(marker, cfg)
    if change is None:
        return None
    if trainer.is_deepspeed_enabled:  # without DeepSpeed HF loads the weights itself, at the same moment
        trainer._load_from_checkpoint(str(resume_from))
    trainer.tp_engine_switch = EngineSwitch(Path(resume_from), marker, change)
    return change


def restore(trainer, switch: EngineSwitch) -> None:
    """After HF built the engine, optimizer and scheduler (no checkpoint loaded): set the optimizer's moments and
    step, DeepSpeed's fp32 masters, and the learning-rate schedule from the other engine's checkpoint."""
    if switch.moments_carry():
        states, step, masters = read_states(switch.checkpoint, switch.marker, trainer)
        if trainer.is_deepspeed_enabled:
            _write_deepspeed(trainer, states, step, masters)
        else:
            _write_torch(trainer, states, step)
    scheduler = _scheduler_state(switch.checkpoint, switch.marker)
    if scheduler is not None and trainer.lr_scheduler is not None:
        _load_schedule(trainer.lr_scheduler, scheduler)


# -- reading ----------------------------------------------------------------------------------------
def read_states(checkpoint: Path, marker: dict, trainer) -> tuple[dict, int, dict]:
    """``({parameter name: {"exp_avg", "exp_avg_sq"}}, step count, {name: fp32 master})`` of a checkpoint; the
    masters only for DeepSpeed checkpoints (plain ones hold the weights themselves)."""
    if marker.get("deepspeed"):
        return _deepspeed_states(checkpoint, {n: _full_shape(p) for n, p in trainer.model.named_parameters()})
    return _torch_states(checkpoint, trainer)


def _torch_states(checkpoint: Path, trainer) -> tuple[dict, int, dict]:
    """A plain checkpoint's ``optimizer.pt``: parameters are numbered in the order HF's ``create_optimizer`` grouped
    them (the decayed trainable ones, then the others, each in ``named_parameters`` order)."""
    saved = torch.load(checkpoint / "optimizer.pt", map_location="cpu", weights_only=True)
    ids = [i for group in saved["param_groups"] for i in group["params"]]
    names = _optimizer_order(trainer)
    if len(ids) != len(names):
        raise RuntimeError(f"{checkpoint / 'optimizer.pt'} holds {len(ids)} parameters, the model trains "
                           f"{len(names)}: it was written for another model or method")
    by_id = dict(zip(ids, names))
    shapes = {n: _full_shape(p) for n, p in trainer.model.named_parameters()}
    states, step = {}, 0
    for index, state in saved["state"].items():
        name = by_id[index]
        state = {**state, **state.get(BNB_WRAPPED, {})}  # bitsandbytes wraps its (fp32 here) states under this key
        moments = {key: state[theirs] for key, theirs in zip(MOMENTS, BNB_MOMENTS if "state1" in state else MOMENTS)}
        if moments["exp_avg"].shape != shapes[name]:
            raise RuntimeError(f"{checkpoint / 'optimizer.pt'}: the state of {name} has shape "
                               f"{tuple(moments['exp_avg'].shape)}, the parameter {tuple(shapes[name])}")
        states[name] = moments
        step = int(state["step"])
    return states, step, {}


def _full_shape(param: torch.Tensor) -> torch.Size:
    """A parameter's whole shape: under ZeRO-3 the tensor itself is an empty placeholder (its shard lives in the
    partitioned flat buffers) and DeepSpeed keeps the real shape as ``ds_shape``."""
    return getattr(param, "ds_shape", param.shape)


MOMENTS = ("exp_avg", "exp_avg_sq")  # PyTorch's AdamW names for the moments; bitsandbytes' 32-bit AdamW's:
BNB_MOMENTS = ("state1", "state2")
BNB_WRAPPED = "__bnb_optimizer_quant_state__"  # bitsandbytes.optim.optimizer.Optimizer8bit._FSDP_WRAPPED_QUANT_STATE_KEY


def _optimizer_order(trainer) -> list[str]:
    model = trainer.model
    decay = set(trainer.get_decay_parameter_names(model))
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [n for n, _ in trainable if n in decay] + [n for n, _ in trainable if n not in decay]


def _deepspeed_states(checkpoint: Path, shapes: dict) -> tuple[dict, int, dict]:
    """A DeepSpeed checkpoint's per-parameter states, through DeepSpeed's own universal-checkpoint converter (any
    ZeRO stage, any number of ranks), in a scratch folder beside the run's checkpoints. ``shapes``: each parameter's
    whole shape (a ZeRO-3 checkpoint's converted states are flat)."""
    import argparse

    lean.bring_back("deepspeed")  # a run without DeepSpeed left it unimported (lean): reading its checkpoint needs it
    from deepspeed.checkpoint import ds_to_universal

    source = sorted(glob.glob(str(checkpoint / "global_step*")))[-1]
    scratch = Path(tempfile.mkdtemp(prefix=".engine-switch-", dir=checkpoint.parent))
    try:
        ds_to_universal.main(argparse.Namespace(
            input_folder=source, output_folder=str(scratch), num_extract_workers=1, num_merge_workers=1,
            keep_temp_folder=False, strict=True, inject_missing_state=True))
        states, step, masters = _universal_states(scratch / "zero", shapes)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return states, step if step is not None else _zero3_step(source), masters


def _universal_states(folder: Path, shapes: dict) -> tuple[dict, int | None, dict]:
    """The converted per-parameter folders: ``fp32``, ``exp_avg``, ``exp_avg_sq`` and (ZeRO-1/2) ``step``. The step
    is None where no parameter has one (ZeRO-3's conversion writes none)."""
    states, masters, step = {}, {}, None
    for param in sorted(p for p in folder.iterdir() if p.is_dir()):
        files = {f.stem: f for f in param.glob("*.pt")}
        shape = shapes.get(param.name)
        masters[param.name] = _param(files["fp32"], shape)
        if "exp_avg" in files:  # a tied weight (lm_head) has only its fp32 copy
            states[param.name] = {key: _param(files[key], shape) for key in MOMENTS}
            step = int(torch.load(files["step"], map_location="cpu", weights_only=False)) if "step" in files else step
    return states, step, masters


def _param(path: Path, shape) -> torch.Tensor:
    """One converted state: ZeRO-1/2's ``{"param": tensor}`` in the parameter's shape; ZeRO-3's the bare tensor,
    flat (its shards concatenated, padding left out), given the parameter's shape here."""
    saved = torch.load(path, map_location="cpu", weights_only=False)
    tensor = saved["param"] if isinstance(saved, dict) else saved
    return tensor.reshape(shape) if shape is not None and tensor.numel() == math.prod(shape) else tensor


def _zero3_step(source: str) -> int:
    """The optimizer's step count of a ZeRO-3 checkpoint, read from a rank's own optimizer states (every rank, every
    flat group counts the same steps)."""
    path = sorted(glob.glob(str(Path(source) / "*optim_states.pt")))[0]
    saved = torch.load(path, map_location="cpu", weights_only=False)["optimizer_state_dict"]["optimizer_state_dict"]
    return int(next(iter(saved["state"].values()))["step"])


def _scheduler_state(checkpoint: Path, marker: dict) -> dict | None:
    """The learning-rate scheduler's state: ``scheduler.pt`` (HF writes it for plain runs), else the DeepSpeed
    checkpoint's model-states file (DeepSpeed steps and saves the scheduler it was given)."""
    plain = checkpoint / "scheduler.pt"
    if plain.is_file():
        return torch.load(plain, map_location="cpu", weights_only=True)
    for path in sorted(glob.glob(str(checkpoint / "global_step*" / "*model_states.pt"))):
        state = torch.load(path, map_location="cpu", weights_only=False).get("lr_scheduler")
        if state:
            return state
    return None


def _load_schedule(scheduler, saved: dict) -> None:
    """Restore the schedule's position, and the learning rate it sets now. The engines group the parameters
    differently (HF: decayed and not; DeepSpeed's optimizer: one group), and HF gives every group the same schedule:
    per-group entries are taken from the first group. The optimizer's groups get the current rate (loading a
    scheduler's state does not set it, and the optimizer's own state, which would, came from the other engine)."""
    inner = getattr(scheduler, "scheduler", scheduler)  # accelerate wraps it
    groups = inner.optimizer.param_groups
    state = dict(saved)
    for key in ("base_lrs", "_last_lr", "lr_lambdas"):
        if isinstance(state.get(key), list) and state[key] and len(state[key]) != len(groups):
            state[key] = [state[key][0]] * len(groups)
    inner.load_state_dict(state)
    for group, lr in zip(groups, inner.get_last_lr()):
        group["lr"] = lr


# -- writing ----------------------------------------------------------------------------------------
def _write_deepspeed(trainer, states: dict, step: int, masters: dict) -> None:
    """Into a DeepSpeed ZeRO optimizer: create its (lazily made) state for each flat fp32 partition, then set every
    parameter's fragment through DeepSpeed's partition-aware setters."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    zero = trainer.model_wrapped.optimizer
    flats = getattr(zero, "fp32_partitioned_groups_flat", None) or zero.single_partition_of_fp32_groups  # ZeRO-3 | 1-2
    base = zero.optimizer
    for flat in flats:
        count = step if isinstance(base, DeepSpeedCPUAdam) else torch.tensor(float(step))  # CPU Adam counts in int
        base.state[flat] = {"step": count, "exp_avg": torch.zeros_like(flat), "exp_avg_sq": torch.zeros_like(flat)}
    if hasattr(zero, "_lazy_init_hp_params_optimizer_state"):  # ZeRO-1/2: link each parameter to its fragment
        zero._lazy_init_hp_params_optimizer_state()
    for name, param in trainer.model.named_parameters():
        if name in masters and param.requires_grad:
            safe_set_full_fp32_param(param, masters[name].to(torch.float32))
        for key, value in states.get(name, {}).items():
            safe_set_full_optimizer_state(param, value.to(torch.float32), key)


def _write_torch(trainer, states: dict, step: int) -> None:
    """Into the optimizer HF built (PyTorch's AdamW, or bitsandbytes' 32-bit AdamW): each parameter's moments and
    step; with the step fused into backward, into each parameter's own optimizer (``in_backward``)."""
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate wraps it
    per_param = getattr(optimizer, "optimizer_dict", None)  # the fused step: one optimizer per parameter
    for name, param in trainer.model.named_parameters():
        saved = states.get(name)
        if saved is None or not param.requires_grad:
            continue
        target = per_param[param] if per_param is not None else optimizer
        if hasattr(target, "get_state_buffer"):  # bitsandbytes: its names, an int count, (paged) fp32 buffers
            target.state[param] = {"step": step, **{ours: target.get_state_buffer(param).copy_(saved[theirs])
                                                    for ours, theirs in zip(BNB_MOMENTS, MOMENTS)}}
            continue
        on_device = any(g.get("fused") or g.get("capturable") for g in target.param_groups)
        count = torch.tensor(float(step), device=param.device if on_device else "cpu")
        target.state[param] = {"step": count, **{k: v.to(param.device, param.dtype) for k, v in saved.items()}}
