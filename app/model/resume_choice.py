"""Resume on another number of GPUs from the window (``trainpilot-cli resume RUN --set distributed.num_gpus=N``,
docs/gpus.md "Resuming on another number of GPUs"): whether to ask, how many the run trained on, and what a count
would change — the CLI's own rules (``create.resume_config`` splits the effective batch anew or refuses, naming the
counts that keep it; ``checkpoints.ranks_change`` words the change), read before anything starts. Light: no Qt."""
from __future__ import annotations

from pathlib import Path

from trainer import config as config_mod
from trainer.core.errors import UserError
from trainer.rundir.checkpoints import latest_checkpoint, ranks_change, read_marker
from trainer.supervisor.create import resume_config, setting_count


def run_gpus(run_dir: str) -> tuple[int, int]:
    """(GPUs per machine, machines) the run's ``config.yaml`` records; (1, 1) when it cannot be read."""
    try:
        d = config_mod.read_yaml(Path(run_dir) / "config.yaml").get("distributed") or {}
    except (OSError, ValueError, UserError):
        return 1, 1
    return setting_count(d.get("num_gpus")), setting_count(d.get("num_nodes"))


def machine_gpus(snapshot) -> int:
    """The GPUs this machine's snapshot lists (0 without one)."""
    return len(getattr(snapshot, "gpus", None) or ())


def needs_choice(run_dir: str, snapshot) -> bool:
    """Ask how many GPUs to resume on where there is a choice: one machine's run, on a machine with several GPUs, or
    with fewer than the run trained on (a machine that lost a card). A one-GPU run on a one-GPU machine just resumes."""
    gpus, nodes = run_gpus(run_dir)
    have = machine_gpus(snapshot)
    return nodes == 1 and have >= 1 and (have > 1 or gpus > have)


def choice_range(run_dir: str, snapshot) -> tuple[int, int, int]:
    """(least, most, the count to offer first): 1 to the machine's GPUs (or the run's, if more); first the run's own
    count where this machine has it, else all of this machine's."""
    gpus, _ = run_gpus(run_dir)
    have = machine_gpus(snapshot) or 1
    return 1, max(have, gpus), gpus if gpus <= have else have


def consequence(run_dir: str, n: int, snapshot=None) -> tuple[str, bool]:
    """What resuming on ``n`` GPUs does, in words, and whether it can start: as it trained; the CLI's message for
    another count ("Resumes on 1 GPU (was 2): accumulation 2 → 4, effective batch 8 kept."); or the refusal (the
    effective batch cannot be kept on ``n``, naming the counts that can; more GPUs than this machine has)."""
    gpus, _ = run_gpus(run_dir)
    have = machine_gpus(snapshot)
    if snapshot is not None and n > have:
        return (f"this machine has {have} GPU{'s' if have != 1 else ''}; resume on {have} or fewer", False)
    if n == gpus:
        return f"Resumes on {n} GPU{'s' if n != 1 else ''}, as it trained.", True
    try:
        cfg = resume_config(Path(run_dir), [f"distributed.num_gpus={n}"])
    except (UserError, config_mod.ConfigError) as exc:
        return str(exc), False
    ckpt = latest_checkpoint(Path(run_dir) / "checkpoints")
    change = ranks_change(read_marker(ckpt), cfg) if ckpt else None
    if change:  # the CLI's words, said before it happens: "on 1 GPU (was 2): accumulation 2 → 4, …"
        said = change["message"].removeprefix("resumed ")
        return f"Resumes {said}.", True
    return f"Resumes on {n} GPU{'s' if n != 1 else ''} (was {gpus}); the effective batch is kept.", True


def overrides(run_dir: str, n: int) -> list[str]:
    """The ``--set`` items for resuming on ``n`` GPUs ([] for the run's own count)."""
    return [] if n == run_gpus(run_dir)[0] else [f"distributed.num_gpus={n}"]
