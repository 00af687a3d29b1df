"""A DeepSpeed hostfile (``distributed.hostfile``) read by DeepSpeed 0.19.8's own rules, so that what TrainPilot
accepts is exactly what the launcher will, and what it refuses is said before anything starts (exit 2, the line and
the fix) instead of as a launcher traceback on one machine while the other waits at the rendezvous.

The rules, from ``deepspeed/launcher/runner.py`` (``fetch_hostfile``, ``_parse_hostfile``): each line is stripped;
an empty line or one starting with ``#`` is skipped; any other line must match ``^(\\S+)\\s+slots=(\\d+)`` (re.search:
what follows the digits is ignored, so ``node-1 slots=2 # two cards`` reads 2); a host named twice, or a file with
no host, is refused. The order of the lines is the order of the machines: the first host is node 0, whose address
the others meet at (``master_addr``). Light: the rules are copied, not imported (this room never imports deepspeed).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# DeepSpeed 0.19.8, deepspeed/launcher/runner.py, _parse_hostfile
LINE = re.compile(r"^(\S+)\s+slots=(\d+)")
# Where no hostfile names node 0 (one machine, or two "machines" on one computer): the loopback address.
LOCAL_ADDR = "127.0.0.1"


class HostfileError(ValueError):
    """A hostfile DeepSpeed's launcher would refuse: ``message`` names the line (1-based) and the fix."""


@dataclass(frozen=True)
class Host:
    """One machine of a hostfile: its name as written, its slots (GPUs, ranks), the 1-based line it is on."""

    name: str
    slots: int
    line: int


def parse(text: str, source: str = "hostfile") -> tuple[Host, ...]:
    """The hosts of a hostfile's ``text``, in order; HostfileError (naming ``source``, the line and the fix) for a
    line that is not ``host slots=N``, a host named twice, or no host at all."""
    hosts: list[Host] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line.startswith("#") or line == "":
            continue
        match = LINE.search(line)
        if match is None:
            raise HostfileError(f"{source} line {number}: {line!r} is not 'hostname slots=N' (a host name, a space, "
                                f"then slots= and the number of GPUs, e.g. 'worker-1 slots=2'); fix the line or "
                                f"comment it out with #")
        name, slots = match.group(1), int(match.group(2))
        if name in seen:
            raise HostfileError(f"{source} line {number}: {name} is already on line {seen[name]}; list each machine "
                                f"once (DeepSpeed's launcher refuses a host named twice)")
        seen[name] = number
        hosts.append(Host(name, slots, number))
    if not hosts:
        raise HostfileError(f"{source} names no machine; write one 'hostname slots=N' line per machine (the first is "
                            f"node 0, which the others connect to)")
    return tuple(hosts)


def read(path: str | Path) -> tuple[Host, ...]:
    """The hosts of the hostfile at ``path`` (``~`` expanded); HostfileError when it is missing, unreadable or does
    not parse."""
    file = Path(path).expanduser()
    try:
        text = file.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise HostfileError(f"{path} not found; write one 'hostname slots=N' line per machine") from None
    except OSError as exc:
        raise HostfileError(f"{path} cannot be read ({exc.strerror}); make it readable, or point "
                            f"distributed.hostfile at another file") from None
    return parse(text, source=str(path))


def problems(cfg) -> list[str]:
    """What is wrong with ``cfg``'s hostfile for its ``distributed`` section (one message each, with the fix): it does
    not parse, names fewer machines than ``num_nodes``, or a machine of the run has slots ≠ ``num_gpus``. [] when the
    run names no hostfile."""
    d = cfg.distributed
    if not d.hostfile:
        return []
    try:
        hosts = read(d.hostfile)
    except HostfileError as exc:
        return [str(exc)]
    out = []
    if len(hosts) < d.num_nodes:
        out.append(f"{d.hostfile} names {len(hosts)} machine(s) but distributed.num_nodes is {d.num_nodes}; add a "
                   f"'hostname slots={d.num_gpus}' line per machine, or lower distributed.num_nodes to {len(hosts)}")
    for host in hosts[: d.num_nodes]:
        if host.slots != d.num_gpus:
            out.append(f"{d.hostfile} line {host.line}: {host.name} has slots={host.slots} but distributed.num_gpus is "
                       f"{d.num_gpus} (every machine trains the same number of ranks); write slots={d.num_gpus}, or "
                       f"set distributed.num_gpus: {host.slots}")
            break
    return out


def master_addr(cfg) -> str:
    """Where the machines meet (the rendezvous host, node 0): ``distributed.master_addr`` when set, else the first
    host of the hostfile, else the loopback address (one machine)."""
    d = cfg.distributed
    if d.master_addr:
        return d.master_addr
    if d.hostfile:
        try:
            return read(d.hostfile)[0].name
        except HostfileError:
            pass  # preflight refused it already; a launch from an exported script says it again
    return LOCAL_ADDR
