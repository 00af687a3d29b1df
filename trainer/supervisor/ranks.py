"""Several ranks supervised as one run: which rank died, read from what the launcher and the ranks print.

The supervisor starts one launcher (torchrun, or the DeepSpeed launcher) and sees one exit code; the rank that died
first is what the user needs (its machine, its exit, the checkpoint the run resumes from). The sources, in the
supervisor's pipes:

- each rank of a launched run announces itself as it starts (``announcement``: rank, local rank, host, pid);
- torchrun prints a failure summary when a rank fails (torch.distributed.elastic's ``ChildFailedError``): one block
  per failed rank with ``rank : R (local_rank: L)``, ``host``, ``exitcode : C (pid: P)``, the first observed one under
  "Root Cause". When a rank dies torchrun terminates the others (SIGTERM) and some of them land in the summary too:
  a rank killed by another signal (SIGKILL, SIGSEGV: the one that died) wins over them, then the root cause;
- the DeepSpeed launcher names only the exit code ("exits with return code = C") and terminates the others; the
  rank whose process went first (``RankWatch.poll``, every supervisor tick) is the one that died.

Light: standard library and psutil.
"""
from __future__ import annotations

import re
import signal
import threading
from dataclasses import dataclass, replace

import psutil

# the worker's line (trainer.worker's recipe prints ``argv.rank_announcement`` on each rank of a launched run)
_ANNOUNCED = re.compile(r"trainpilot rank (\d+) \(local rank (\d+), node (\d+)\) of (\d+) on (\S+): pid (\d+)")
# torchrun's failure summary (torch/distributed/elastic/multiprocessing/errors/__init__.py, _format_failure)
_ROOT = re.compile(r"Root Cause \(first observed failure\)")
_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_HOST = re.compile(r"^\s*host\s*:\s*(\S+)")
_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)")
# the DeepSpeed launcher (deepspeed/launcher/launch.py, sigkill_handler)
_DS_EXIT = re.compile(r"exits with return code = (-?\d+)")
# what launchers send the ranks they end because another died
_TERMINATING = (signal.SIGTERM, signal.SIGINT)


@dataclass(frozen=True)
class RankExit:
    """One rank's end: its global ``rank``, ``local_rank`` on its machine, ``host``, ``exit_code`` (negative: the
    signal that killed it; None where the launcher did not say), ``pid``, and whether torchrun named it the root
    cause (the first failure it observed)."""

    rank: int
    local_rank: int | None
    host: str | None
    exit_code: int | None
    pid: int | None = None
    root_cause: bool = False
    node: int | None = None  # the machine's node rank (distributed.node_rank), where the rank announced it

    def words(self) -> str:
        """'rank 1 (local rank 1 on node-b) was killed by signal 9 (SIGKILL)' or '… exited with code 1'."""
        where = f" on {self.host}" if self.host else ""
        where += f", node {self.node}" if self.node is not None else ""
        local = f" (local rank {self.local_rank}{where})" if self.local_rank is not None else where
        code = self.exit_code
        if code is None:
            how = "died"
        elif code < 0:
            how = f"was killed by signal {-code} ({signal_name(-code)})"
        else:
            how = f"exited with code {code}"
        return f"rank {self.rank}{local} {how}"


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return "unknown"


class RankWatch:
    """Reads the supervisor's output lines (``feed``, from both pipe threads) and the ranks' processes (``poll``);
    ``culprit`` says which rank ended the run."""

    def __init__(self):
        self._lock = threading.Lock()
        self.ranks: dict[int, RankExit] = {}  # announced, by pid
        self.failures: list[RankExit] = []  # torchrun's summary
        self.first_gone: RankExit | None = None  # the first announced rank whose process ended
        self.launcher_exit: int | None = None  # the DeepSpeed launcher's "return code"
        self._block: dict = {}
        self._root = False

    def feed(self, line: str) -> None:
        """One line of the launcher's or a rank's output."""
        with self._lock:
            self._feed(line)

    def _feed(self, line: str) -> None:
        m = _ANNOUNCED.search(line)
        if m:
            rank, local, node, _, host, pid = m.groups()
            self.ranks[int(pid)] = RankExit(int(rank), int(local), host, None, int(pid), node=int(node))
            return
        if _ROOT.search(line):
            self._root = True
            return
        m = _HOST.match(line)  # a block's lines: time, host, rank, exitcode, error_file, traceback
        if m:
            self._block = {"host": m.group(1)}
            return
        m = _RANK.match(line)
        if m:
            self._block.update(rank=int(m.group(1)), local_rank=int(m.group(2)))
            return
        m = _EXIT.match(line)
        if m and "rank" in self._block:
            self.failures.append(RankExit(self._block["rank"], self._block["local_rank"], self._block.get("host"),
                                          int(m.group(1)), int(m.group(2)), self._root))
            self._block = {}
            return
        m = _DS_EXIT.search(line)
        if m:
            self.launcher_exit = int(m.group(1))

    def poll(self) -> None:
        """Note the first announced rank whose process has ended (a zombie not yet reaped by its launcher counts)."""
        with self._lock:
            if self.first_gone is not None or not self.ranks:
                return
            for pid, rank in self.ranks.items():
                if not _alive(pid):
                    self.first_gone = rank
                    return

    def culprit(self) -> RankExit | None:
        """The rank that ended the run: from torchrun's summary (a rank killed by a signal other than the launcher's
        own SIGTERM/SIGINT, then the root cause, then the first failure), else the first announced rank to go (with
        the DeepSpeed launcher's exit code). None when nothing names one (a single process, or no rank announced)."""
        with self._lock:
            if self.failures:
                picked = _pick(self.failures)
                told = next((r for r in self.ranks.values() if r.rank == picked.rank), None)
                # the rank's own host name (torchrun's summary may say "localhost" for its own machine)
                return replace(picked, node=told.node, host=told.host) if told is not None else picked
            if self.first_gone is not None:
                return replace(self.first_gone, exit_code=self.launcher_exit)
            return None


def _pick(failures: list[RankExit]) -> RankExit:
    killed = [f for f in failures if f.exit_code is not None and f.exit_code < 0
              and -f.exit_code not in {s.value for s in _TERMINATING}]
    if killed:
        roots = [f for f in killed if f.root_cause]
        return (roots or killed)[0]
    roots = [f for f in failures if f.root_cause]
    return (roots or failures)[0]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
