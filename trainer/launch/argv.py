"""The command lines that start workers: one process, torchrun, or the DeepSpeed launcher (light)."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from trainer.config.resolved import resolve_launcher
from trainer.core.errors import UserError
from trainer.core import entrypoints


def launcher_for(cfg) -> str:
    """'single', 'torchrun' or 'deepspeed' for this config (the rule: ``resolve_launcher``)."""
    return resolve_launcher(cfg)


# Set by launchers for their children; a lone worker inheriting them (say, from a shell inside a
# torchrun job, or a process that initialised torch.distributed) would join a group that is not its own.
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                  "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "CROSS_RANK", "CROSS_SIZE")


# PyTorch's CUDA caching allocator: expandable segments grow one mapping instead of carving fixed blocks, so memory
# freed by one size can serve another (at long sequences the planner counted 4.3 GiB of 29.2 as fragmentation).
# Linux only: PyTorch's Windows builds ignore it with a warning ("expandable_segments not supported on this platform").
ALLOCATOR_VARIABLE = "PYTORCH_CUDA_ALLOC_CONF"
ALLOCATOR_SETTING = "expandable_segments:True"


def allocator_env(env, platform: str = sys.platform) -> dict:
    """``{PYTORCH_CUDA_ALLOC_CONF: expandable segments}`` for a worker started with environment ``env``, or {} where
    the user set the variable themselves (theirs is kept) or the platform has no expandable segments (not Linux).
    Harmless for a CPU worker (the CUDA allocator is never used)."""
    if ALLOCATOR_VARIABLE in env or not platform.startswith("linux"):
        return {}
    return {ALLOCATOR_VARIABLE: ALLOCATOR_SETTING}


# Which cards the worker(s) see (docs/gpus.md): the run's ``distributed.gpus``, by UUID (stable across reboots; NVML's
# and CUDA's indices are not always the same order). PCI_BUS_ID makes an index, where a config gives one, mean the card
# NVML and nvidia-smi number so (CUDA's own default order is fastest first).
VISIBLE_VARIABLE = "CUDA_VISIBLE_DEVICES"
ORDER_VARIABLE = "CUDA_DEVICE_ORDER"


def visible_devices_env(cfg) -> dict:
    """``{CUDA_VISIBLE_DEVICES: the run's cards, comma-separated; CUDA_DEVICE_ORDER: PCI_BUS_ID}`` where
    ``distributed.gpus`` lists cards; {} where it is 'auto' (a hand-made config: every card) or [] (a CPU run)."""
    gpus = cfg.distributed.gpus if cfg is not None else None
    if not isinstance(gpus, list) or not gpus:
        return {}
    return {VISIBLE_VARIABLE: ",".join(str(g) for g in gpus), ORDER_VARIABLE: "PCI_BUS_ID"}


def worker_env(base: dict, cfg=None) -> dict:
    """The environment for the worker(s): ``base`` plus unbuffered output, the CUDA allocator's expandable
    segments (``allocator_env``) and the run's cards (``visible_devices_env`` of ``cfg``, when given), without
    inherited rank variables."""
    env = {k: v for k, v in base.items() if k not in RANK_VARIABLES}
    env.update(PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", **allocator_env(base), **visible_devices_env(cfg))
    return env


def needs_process_group(cfg) -> bool:
    """True when the worker(s) of ``cfg`` train in a torch.distributed process group: several ranks, or
    DeepSpeed (which wants one even for one process). A lone plain worker has none: with RANK/WORLD_SIZE
    set, accelerate starts a group and HF's Trainer wraps the model in DistributedDataParallel
    (measured 16% fewer tokens/s on the CPU demo)."""
    return cfg.world_size > 1 or cfg.deepspeed.enabled is True


def rank_environment(cfg) -> None:
    """Set this worker process's rank variables for ``cfg`` (in ``os.environ``).

    Several ranks: the launcher (torchrun, deepspeed) set them; kept. One rank: the supervisor starts it
    without a launcher, so any rank variables here were inherited from elsewhere and are dropped; then
    a DeepSpeed run becomes rank 0 of 1 on a free port, a plain run gets none (no process group).

    The run's cards are set again here, before CUDA starts: the DeepSpeed launcher gives its ranks
    CUDA_VISIBLE_DEVICES=0,1,… of its own (by CUDA's index), and ranks on other machines start without the
    supervisor's environment."""
    os.environ.update(visible_devices_env(cfg))
    if launcher_for(cfg) != "single":
        return
    for name in RANK_VARIABLES:
        os.environ.pop(name, None)
    if needs_process_group(cfg):
        single_process_env()


def single_process_env() -> None:
    """Make this lone process rank 0 of 1 on a free local port (DeepSpeed otherwise tries MPI discovery).
    Left alone when a launcher already set the ranks."""
    import socket

    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def worker_command(cfg, run_dir: Path, resume_from: Path | None = None, python: str | None = None) -> list[str]:
    """argv that starts the worker(s) of ``run_dir`` (resuming from a checkpoint when given)."""
    py = python or sys.executable
    tail = ["--run-dir", str(run_dir)] + (["--resume-from", str(resume_from)] if resume_from else [])
    d = cfg.distributed
    kind = launcher_for(cfg)
    if kind == "single":
        return entrypoints.python_m(entrypoints.WORKER, *tail, python=py)
    if kind == "torchrun":
        if d.num_nodes > 1:

            raise UserError("distributed.launcher: several machines run through the DeepSpeed launcher; set "
                            "distributed.launcher: deepspeed (or auto)", field="distributed.launcher")
        return [py, "-m", "torch.distributed.run", "--nproc_per_node", str(d.num_gpus),
                "--master_port", str(d.master_port), "-m", entrypoints.WORKER, *tail]
    ds = shutil.which("deepspeed") or "deepspeed"
    cmd = [ds, "--num_gpus", str(d.num_gpus), "--master_port", str(d.master_port)]
    if d.num_nodes > 1:
        cmd += ["--num_nodes", str(d.num_nodes), "--hostfile", str(d.hostfile)]
    return cmd + ["--module", entrypoints.WORKER, *tail]
