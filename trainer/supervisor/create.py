"""Creating a run directory: resolve the config through the planner, check every input, write files.

Nothing is created until every check passed, so bad input leaves no trace. Light module.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from trainer import config as config_mod
from trainer.config.resolved import ResolvedRunConfig, as_resolved
from trainer.core.errors import UserError
from trainer.launch.dsconfig import deepspeed_config
from trainer.launch.export_scripts import write_launch_scripts
from trainer.planning.plan import plan_run
from trainer.rundir.events import write_json_atomic
from trainer.supervisor import runlock


def resolve(cfg, hardware) -> tuple[ResolvedRunConfig, dict]:
    """``(resolved config, plan dict)``: the planner fills every 'auto' for this hardware (UserError
    naming a field it could not resolve)."""
    plan = plan_run(cfg, hardware)
    return as_resolved(plan.resolved), plan.to_dict()


# What ``trainpilot-cli resume --set`` may change: where the run trains and how its effective batch is split. The
# rest is what the checkpoint was trained with (the model, the data, the objective, the schedule): a new run changes it.
RESUME_KEYS = ("distributed.", "training.micro_batch_size", "training.gradient_accumulation_steps")


def resume_config(run_dir: Path, overrides: list[str]):
    """The config a resume of ``run_dir`` trains with: its own ``config.yaml``, with ``overrides`` (``--set``)
    limited to ``RESUME_KEYS``. On another number of ranks the effective batch is kept exact: the micro-batch stays
    (each rank's memory is what the plan fitted) and the accumulation is split anew, effective / (micro × ranks),
    unless the override sets it; the cards the run recorded (``distributed.gpus``, by UUID) give way to the planner's
    choice when they are not the new count, unless the override lists them. UserError (exit 2, nothing written) when
    a key is not a resume's or the effective batch cannot be kept; ConfigError from the config's own checks."""
    path = Path(run_dir) / "config.yaml"
    if not overrides:
        return config_mod.load(path)
    keys = [config_mod.parse_override(item)[0] for item in overrides]
    dotted = [".".join(k) for k in keys]
    for key in dotted:
        if not any(key == allowed or (allowed.endswith(".") and key.startswith(allowed)) for allowed in RESUME_KEYS):
            raise UserError(f"resume --set {key}: a resume changes only where the run trains (distributed.*) and how "
                            f"its effective batch is split (training.micro_batch_size, "
                            f"training.gradient_accumulation_steps); to change {key}, start a new run "
                            f"(trainpilot-cli run {path} --set {key}=...)", field=key, path=str(path))
    data = config_mod.apply_overrides(config_mod.read_yaml(path), overrides)
    t, d = data.get("training") or {}, data.get("distributed") or {}
    cards = d.get("gpus")
    if "distributed.gpus" not in dotted and isinstance(cards, list) and cards and len(cards) != d.get("num_gpus"):
        d["gpus"] = "auto"  # the run's recorded cards are another count: the planner picks the new one(s), and says
    if "distributed.gpus" in dotted and "distributed.num_gpus" not in dotted and isinstance(cards, list) and cards:
        d["num_gpus"] = len(cards)  # the cards listed say how many, as in a new config
    split = d.get("layer_split") is True
    if split and isinstance(d.get("layers_per_gpu"), list) and len(d["layers_per_gpu"]) != setting_count(d.get("num_gpus")):
        d["layers_per_gpu"] = "auto"  # the layers split over another number of cards: the planner splits them anew
    ranks = (1 if split else setting_count(d.get("num_gpus"))) * setting_count(d.get("num_nodes"))  # a split is one rank
    if ranks > 1 and d.get("launcher") == "single" and "distributed.launcher" not in dotted:
        d["launcher"] = "auto"  # a run planned on one GPU recorded one process; on several the planner picks the launcher
    micro, effective = t.get("micro_batch_size"), t.get("effective_batch_size")
    if "training.gradient_accumulation_steps" not in dotted and isinstance(micro, int) and isinstance(effective, int):
        if effective % (micro * ranks):
            divisors = [n for n in range(1, effective // micro + 1) if (effective // micro) % n == 0]
            raise UserError(f"distributed.num_gpus: the run's effective batch {effective} cannot be kept on {ranks} "
                            f"GPU(s) at micro-batch {micro} ({micro} × {ranks} does not divide {effective}); resume on "
                            f"{' or '.join(map(str, divisors))} GPU(s), or set training.micro_batch_size to one that "
                            f"divides {effective} / {ranks}", field="distributed.num_gpus", path=str(path))
        t["gradient_accumulation_steps"] = effective // (micro * ranks)
    return config_mod.validate(data, source=str(path))


def setting_count(value) -> int:
    """A count a run folder's config records (GPUs, machines): the value where it is a positive int, else 1."""
    return value if isinstance(value, int) and value > 0 else 1


def default_run_dir(cfg) -> Path:
    """``<runs_dir>/<run_name or name-YYYYmmdd-HHMMSS>``."""
    name = cfg.output.run_name or f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path(cfg.output.runs_dir).expanduser() / name


def run_dir_problem(path: Path, overwrite: bool) -> UserError | None:
    """Why ``path`` cannot become a new run's folder (it holds another run and ``overwrite`` is off; it, or the
    folder it would be made in, cannot be written), or None. Creates nothing: Review asks it before Start."""
    path = Path(path)
    if path.exists() and (not path.is_dir() or any(path.iterdir())) and not overwrite:
        return UserError(f"run directory {path} already exists; continue it with 'trainpilot-cli resume {path}', "
                         f"choose another --run-dir, or pass --overwrite (the old one is kept as "
                         f"{path.name}.replaced-<time>)", field="output.run_name", path=str(path))
    if path.is_dir() and not any(path.iterdir()):  # an empty folder is used as it is: it must take the run's files
        where = path
    else:  # made (with --overwrite: the old one moved aside first) in the nearest existing folder above it
        where = next((p for p in [path.parent, *path.parent.parents] if p.exists()), None)
    if where is not None and not writable_folder(where):
        return UserError(f"output.runs_dir: cannot write in {where}; choose a folder you can write to "
                         f"(--run-dir or output.runs_dir)", field="output.runs_dir", path=str(where))
    return None


def writable_folder(folder: Path) -> bool:
    """Whether this process can create files in ``folder``: a folder, with write and search permission. ``os.access``
    asks the kernel, so a read-only mount or an immutable folder (``chattr +i``) answers False for root too."""
    return folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)


def claim_run_dir(path: Path, overwrite: bool) -> Path:
    """Create ``path`` for a new run. An existing run is never lost: refused, or moved aside with --overwrite."""
    path = Path(path)
    problem = run_dir_problem(path, overwrite)
    if problem is not None:
        raise problem
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        aside = path.with_name(f"{path.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(path, aside)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"output.runs_dir: cannot create {path} ({exc.strerror}); choose a folder you can write to",
                        field="output.runs_dir", path=str(path)) from None
    runlock.hold(path)  # a second `run` racing for the same empty folder stops here
    return path


def pin_chat_date(cfg):
    """The config with ``data.chat_date`` set to today (local time) when it is null: a chat template that prints today's
    date then renders the run's date in training, chat and every export, whatever day they happen."""
    if cfg.data.chat_date is not None:
        return cfg
    return as_resolved(config_mod.replace(cfg, **{"data.chat_date": time.strftime("%Y-%m-%d")}))


def keep_reward_file(run_dir: Path, cfg):
    """A GRPO run's ``rewards.python`` file copied into the run folder (``rewards/<name>.py``), and the config pointed
    at the copy: a resume, the OOM ladder's restart and launch.sh score with the functions the run started with, even
    after the original is edited. Returns the (resolved) config to write."""
    if cfg.training.objective != "grpo" or not cfg.rewards.python:
        return cfg
    src = Path(cfg.rewards.python).expanduser().resolve()
    dst = (Path(run_dir) / "rewards" / src.name).resolve()
    if src != dst:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    return as_resolved(config_mod.replace(cfg, **{"rewards.python": str(dst)}))


def write_config_files(run_dir: Path, cfg, plan: dict | None = None) -> None:
    """config.yaml, ds_config.json, launch.sh/.bat (and plan.json when given), each replaced atomically."""
    _write_text_atomic(run_dir / "config.yaml", config_mod.dump_yaml(cfg))
    ds = deepspeed_config(as_resolved(cfg))
    if ds is not None:
        write_json_atomic(run_dir / "ds_config.json", ds)
    elif (run_dir / "ds_config.json").exists():
        (run_dir / "ds_config.json").unlink()
    if plan is not None:
        write_json_atomic(run_dir / "plan.json", plan)
    write_launch_scripts(run_dir, cfg, run_dir=run_dir)


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)

