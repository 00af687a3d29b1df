"""Export: a config plus the scripts that rerun it from a terminal (one GPU, several, several machines).

``trainpilot-cli export SRC --to DIR`` where SRC is a config file or a run directory. No secret is
ever written: tokens are read from the environment (or the OS keyring) when the run starts.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

from trainer import config as config_mod
from trainer.config.resolved import as_resolved, unresolved
from trainer.core import secrets
from trainer.core.errors import UserError
from trainer.launch.argv import ALLOCATOR_VARIABLE, allocator_env, visible_devices_env
from trainer.launch.dsconfig import deepspeed_config
from trainer.planning.ladder import record_kept_settings

EXPORT_FILES = ("config.yaml", "ds_config.json", "launch.sh", "launch.bat", "launch_multi_gpu.sh",
                "launch_multi_gpu.bat", "launch_multi_node.sh", "hostfile.example", "README.txt")


def _cli_prelude() -> str:
    py = shlex.quote(sys.executable)
    return ('if command -v trainpilot-cli >/dev/null 2>&1; then CLI=(trainpilot-cli); '
            f'else CLI=({py} -m trainer); fi\n')


def _allocator_line(cuda: bool) -> str:
    """The CUDA allocator's setting (``argv.allocator_env``: expandable segments unless you set your own), written
    out where a GPU run starts from a Linux shell; the CLI applies the same rule to the workers it starts."""
    value = allocator_env({}, platform="linux").get(ALLOCATOR_VARIABLE)
    if not cuda or value is None:
        return ""
    return (f"# PyTorch's CUDA allocator grows expandable segments (less fragmentation); a value you set is kept.\n"
            f'export {ALLOCATOR_VARIABLE}="${{{ALLOCATOR_VARIABLE}:-{value}}}"\n')


def _cards_lines(cfg, windows: bool = False) -> list[str]:
    """The run's cards (``argv.visible_devices_env``: config.yaml's ``distributed.gpus``, by UUID) set where the
    script starts, so a reader sees which cards train and a tool started beside the run sees only those;
    ``trainpilot-cli run`` sets the same from config.yaml (docs/gpus.md). [] for 'auto' and a CPU run."""
    env = visible_devices_env(cfg) if cfg is not None and cfg.distributed.num_nodes == 1 else {}
    if not env:
        return []
    if windows:
        return ["rem The run's cards (config.yaml's distributed.gpus); trainpilot-cli run sets the same."] + \
            [f'set "{k}={v}"' for k, v in env.items()]
    return ["# The run's cards (config.yaml's distributed.gpus); trainpilot-cli run sets the same."] + \
        [f"export {k}={shlex.quote(v)}" for k, v in env.items()]


def _sh(comment: str, args: str, cuda: bool = True, checks: str = "", cfg=None) -> str:
    cards = "".join(line + "\n" for line in _cards_lines(cfg))
    return ("#!/usr/bin/env bash\n"
            f"# {comment}\n"
            "# Tokens are read from the environment (HF_TOKEN) or the OS keyring; none is stored here.\n"
            "set -euo pipefail\n"
            'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
            + checks
            + _allocator_line(cuda)
            + cards
            + _cli_prelude()
            + f'exec "${{CLI[@]}}" run "$HERE/config.yaml" {args}"$@"\n')


# launch_multi_node.sh: what each machine says (docs/multi-node.md). NODE_RANK is this machine's number and has no
# default (two machines both taking 0 would wait for each other forever); a missing one is bad input, exit 2.
MULTI_NODE_CHECKS = (
    '# Run it on every machine, the same files on each: NODE_RANK=0 on the first host of the hostfile, 1 on the next…\n'
    '# MASTER_ADDR (node 0\'s address; default the first host of the hostfile), MASTER_PORT (open on node 0),\n'
    '# NUM_NODES, HOSTFILE (default ./hostfile), LAUNCHER (deepspeed or torchrun), RUN_DIR (this machine\'s run folder).\n'
    'if [ -z "${NODE_RANK:-}" ]; then\n'
    '  echo "launch_multi_node.sh: set NODE_RANK to this machine\'s number (0 on the first host of the hostfile, 1 on'
    ' the next, ...), e.g. NODE_RANK=1 $0" >&2\n'
    '  exit 2\n'
    'fi\n'
    'HOSTFILE="${HOSTFILE:-$HERE/hostfile}"\n'
)


def _multi_node_args(cfg) -> str:
    """The ``--set`` options of launch_multi_node.sh, read from its environment (``MULTI_NODE_CHECKS``)."""
    d = cfg.distributed
    launcher = d.launcher if d.launcher in ("torchrun", "deepspeed") else "deepspeed"
    return (f"--set distributed.num_nodes=${{NUM_NODES:-{max(2, d.num_nodes)}}} --set \"distributed.hostfile=$HOSTFILE\" "
            "--set \"distributed.node_rank=$NODE_RANK\" ${MASTER_ADDR:+--set \"distributed.master_addr=$MASTER_ADDR\"} "
            f"--set distributed.master_port=${{MASTER_PORT:-{d.master_port}}} "
            "--set \"distributed.gpus=${GPUS:-auto}\" "
            f"--set distributed.launcher=${{LAUNCHER:-{launcher}}} "
            '${RUN_DIR:+--run-dir "$RUN_DIR"} ')


def _bat(comment: str, args: str, cfg=None) -> str:
    py = sys.executable
    lines = ["@echo off", f"rem {comment}", "rem Tokens are read from the environment (HF_TOKEN) or the keyring.",
             f"rem {ALLOCATOR_VARIABLE} is left as it is: PyTorch's Windows builds have no expandable segments.",
             "setlocal", *_cards_lines(cfg, windows=True), 'set "HERE=%~dp0"', "where trainpilot-cli >nul 2>nul",
             f'if errorlevel 1 (set CLI="{py}" -m trainer) else (set CLI=trainpilot-cli)',
             f'%CLI% run "%HERE%config.yaml" {args}%*', "exit /b %ERRORLEVEL%", ""]
    return "\r\n".join(lines)


def launch_texts(cfg) -> dict[str, str]:
    """Script name → text, for the variants that fit this config."""
    gpus = max(2, cfg.distributed.num_gpus)
    cuda = cfg.device != "cpu"
    # the cards: GPUS='[0, 2]' (indices or UUIDs) picks them, else the planner takes the NUM_GPUS best (docs/gpus.md)
    multi = (f"--set distributed.num_gpus=${{NUM_GPUS:-{gpus}}} --set \"distributed.gpus=${{GPUS:-auto}}\" "
             "--set distributed.launcher=auto ")
    # the layers split over the cards (distributed.layer_split): on another number of cards the planner splits anew
    split = "--set distributed.layers_per_gpu=auto " if cfg.distributed.layer_split is True else ""
    multi += split
    return {
        "launch.sh": _sh("Run this training on this machine (one GPU, or as configured).", "", cuda, cfg=cfg),
        "launch.bat": _bat("Run this training on this machine (Windows).", "", cfg),
        "launch_multi_gpu.sh": _sh((f"The model's layers split over several GPUs of this machine (NUM_GPUS, default "
                                    f"{gpus}; one process)" if split else
                                    f"Data-parallel on several GPUs of this machine (NUM_GPUS, default {gpus})")
                                   + f"; the effective batch stays {cfg.training.effective_batch_size}.", multi, cuda),
        "launch_multi_gpu.bat": _bat("Several GPUs on Windows (torchrun/gloo; DeepSpeed multi-GPU is Linux-only).",
                                     f"--set distributed.num_gpus={gpus} --set distributed.gpus=auto "
                                     f"--set distributed.launcher=auto {split}"),
        "launch_multi_node.sh": _sh("Several machines (the DeepSpeed launcher without ssh, or torchrun): copy "
                                    "hostfile.example to hostfile and edit it (node 0 first); docs/multi-node.md.",
                                    _multi_node_args(cfg), cuda, MULTI_NODE_CHECKS),
    }


def write_launch_scripts(folder: Path, cfg, run_dir: Path | None = None) -> list[Path]:
    """Write the launch scripts into ``folder`` (executable). Returns their paths."""
    written = []
    for name, text in launch_texts(cfg).items():
        if run_dir is not None and name not in ("launch.sh", "launch.bat"):
            continue
        path = Path(folder) / name
        path.write_text(secrets.redact(text), encoding="utf-8", newline="")
        if name.endswith(".sh"):
            path.chmod(0o755)
        written.append(path)
    return written


def _load_source(src: Path):
    if src.is_dir():
        if not (src / "config.yaml").is_file():
            raise UserError(f"{src} is a folder without config.yaml; pass a run directory or a config file", path=str(src))
        return config_mod.load(src / "config.yaml")
    return config_mod.load(src)


def export(src: str, to: str, overwrite: bool = False) -> list[Path]:
    """Write config, DeepSpeed config and launch scripts to ``to``. Returns the files written.
    A folder that cannot be written is bad input (UserError naming --to, exit 2), found before writing."""
    cfg = _load_source(Path(src))
    out = Path(to)
    clash = [n for n in EXPORT_FILES if (out / n).exists()]
    if clash and not overwrite:
        raise UserError(f"--to: {out} already has {', '.join(clash)}; choose an empty folder or pass --overwrite",
                        path=str(out))
    _writable_folder(out)
    try:
        return _write_export(cfg, out)
    except OSError as exc:  # the folder changed under us, the disk filled, a file in it is read-only
        raise UserError(f"--to: writing {exc.filename or out} failed ({exc.strerror}); choose a folder you can "
                        f"write to", field="--to", path=str(out)) from None


def _writable_folder(out: Path) -> None:
    """Create ``out`` if needed; UserError when it cannot be created or written in."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--to: cannot create {out} ({exc.strerror}); choose a folder you can write to",
                        field="--to", path=str(out)) from None
    if not os.access(out, os.W_OK):
        raise UserError(f"--to: cannot write in {out} (permission denied); choose a folder you can write to",
                        field="--to", path=str(out))


def _write_export(cfg, out: Path) -> list[Path]:
    cfg = record_kept_settings(cfg)  # the file sets every key: which were the user's (for the OOM ladder) is kept
    files = [out / "config.yaml"]
    files[0].write_text(secrets.redact(config_mod.dump_yaml(cfg)), encoding="utf-8")
    # A config with "auto" left is planned on the machine that runs it; a resolved one (a run
    # directory's) carries its exact DeepSpeed config.
    ds = None if unresolved(cfg) else deepspeed_config(as_resolved(cfg))
    if ds is not None:
        (out / "ds_config.json").write_text(json.dumps(ds, indent=2))
        files.append(out / "ds_config.json")
    files += write_launch_scripts(out, cfg)
    (out / "hostfile.example").write_text(hostfile_example(cfg))
    (out / "README.txt").write_text(readme_text(out, cfg))
    return files + [out / "hostfile.example", out / "README.txt"]


def hostfile_example(cfg) -> str:
    """hostfile.example: DeepSpeed's format (``config.hostfile``), one line per machine, slots = the run's GPUs each."""
    slots = cfg.distributed.num_gpus
    return ("# one line per machine: hostname slots=<GPUs of that machine>; the first is node 0 (NODE_RANK=0), whose\n"
            "# address the others connect to (MASTER_ADDR, default this first name). Same file on every machine.\n"
            f"worker-1 slots={slots}\nworker-2 slots={slots}\n")


def readme_text(out: Path, cfg) -> str:
    """The exact commands, for humans."""
    return (f"TrainPilot export of '{cfg.name}'\n\n"
            f"One GPU (or as configured):     {out / 'launch.sh'}      (Windows: {out / 'launch.bat'})\n"
            f"Several GPUs on this machine:   NUM_GPUS=2 {out / 'launch_multi_gpu.sh'}   (GPUS='[0, 2]' picks the "
            f"cards; else the planner takes the best)\n"
            f"Several machines:               cp hostfile.example hostfile; edit it (node 0 first); on each "
            f"machine NODE_RANK=<0, 1, ...> {out / 'launch_multi_node.sh'}\n"
            f"Same thing by hand:             trainpilot-cli run {out / 'config.yaml'}\n"
            f"Resume a stopped run:           trainpilot-cli resume runs/<run>\n\n"
            f"Effective batch {cfg.training.effective_batch_size} is kept exact on any number of GPUs when it is "
            f"divisible by micro-batch × GPUs.\nTokens: set HF_TOKEN in the environment (never in config.yaml).\n")
