"""The command lines that start workers: one process, torchrun, or the DeepSpeed launcher (light)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from trainer.config import hostfile
from trainer.config.resolved import resolve_launcher
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


def rank_announcement(cfg) -> str | None:
    """The line each rank of a launched run prints as it starts (``trainer.supervisor.ranks`` reads it back to name
    the rank that died: its local rank, machine and pid); None for a lone worker. Read after the launcher set the
    rank variables (torchrun: GROUP_RANK is the machine's node rank; the DeepSpeed launcher: CROSS_RANK)."""
    if launcher_for(cfg) == "single":
        return None
    import socket

    env = os.environ
    node = env.get("GROUP_RANK") or env.get("CROSS_RANK") or str(cfg.distributed.node_rank)
    return (f"trainpilot rank {env.get('RANK', '0')} (local rank {env.get('LOCAL_RANK', '0')}, node {node}) of "
            f"{env.get('WORLD_SIZE', '1')} on {socket.gethostname()}: pid {os.getpid()}")


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
    """argv that starts the worker(s) of ``run_dir`` (resuming from a checkpoint when given): one process, torchrun,
    or the DeepSpeed launcher. Several machines (docs/multi-node.md): every machine runs this with the same config
    but its own ``distributed.node_rank``; each starts its own ranks and they meet at node 0
    (``hostfile.master_addr``) on ``distributed.master_port``."""
    py = python or sys.executable
    tail = ["--run-dir", str(run_dir)] + (["--resume-from", str(resume_from)] if resume_from else [])
    kind = launcher_for(cfg)
    if kind == "single":
        return entrypoints.python_m(entrypoints.WORKER, *tail, python=py)
    if kind == "torchrun":
        return torchrun_args(cfg, py) + ["-m", entrypoints.WORKER, *tail]
    return deepspeed_args(cfg, py) + ["--module", entrypoints.WORKER, *tail]


def torchrun_args(cfg, python: str) -> list[str]:
    """torchrun's part of the command: the ranks of this machine; with several machines also how many there are,
    which one this is and where node 0 listens (torchrun's static rendezvous: a c10d TCP store on node 0's
    ``master_addr:master_port``)."""
    d = cfg.distributed
    cmd = [python, "-m", "torch.distributed.run", "--nproc_per_node", str(d.num_gpus),
           "--master_port", str(d.master_port)]
    if d.num_nodes > 1:
        cmd += ["--nnodes", str(d.num_nodes), "--node_rank", str(d.node_rank), "--master_addr", hostfile.master_addr(cfg)]
    return cmd


def deepspeed_args(cfg, python: str) -> list[str]:
    """The DeepSpeed launcher's part (``deepspeed.launcher.runner``, what the ``deepspeed`` script runs, from this
    environment's Python). ``--no_local_rank``: the worker reads LOCAL_RANK from its environment, and its argument
    parser would refuse ``--local_rank=N``. Several machines: ``--no_ssh`` (each machine starts its own ranks: no
    passwordless ssh, no pdsh), this machine's ``--node_rank``, the hostfile (the machines and their order) and node
    0's address."""
    d = cfg.distributed
    cmd = [python, "-m", "deepspeed.launcher.runner", "--num_gpus", str(d.num_gpus),
           "--master_port", str(d.master_port), "--no_local_rank"]
    if d.num_nodes > 1:
        cmd += ["--num_nodes", str(d.num_nodes), "--no_ssh", "--node_rank", str(d.node_rank),
                "--master_addr", hostfile.master_addr(cfg), "--hostfile", str(Path(d.hostfile).expanduser())]
    return cmd
