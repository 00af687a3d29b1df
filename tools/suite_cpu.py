"""Where a test run's CPU goes, by kind of process and by test file.

    PYTHONPATH=tools/suite_cpu TRAINPILOT_PROCLOG=/tmp/procs.jsonl CI=true .venv/bin/python -m pytest -q
    python tools/suite_cpu.py /tmp/procs.jsonl

Every Python process of the run logs its own CPU time as it ends (``tools/suite_cpu/sitecustomize.py``); this prints
the CPU seconds per kind of process (training worker, structure probe, export, llama.cpp's converter, the xdist
workers themselves…) with their count and mean, then per test file. Processes killed by a signal, and programs that
are not Python (Go, pip in the installers' own environments), are not in the log: compare the total with the run's
wall time × cores. Measured 27 Nov 2026 (issue 29): 840 processes, 2,582 CPU-seconds of a 28-minute run on 2 cores;
training workers 149 × 5.8 s, of which ~5.5 s is importing torch and transformers. Since then the suite's heavy
children start from a pre-imported interpreter (``tests/zygote``): their lines then count the CPU after the fork
only; ``TRAINPILOT_TEST_ZYGOTE=0`` measures plain starts.
"""
from __future__ import annotations

import collections
import json
import sys


def kind(rec: dict) -> str:
    argv = rec["argv"] or ["?"]
    if argv[0] == "-c":
        return "xdist worker (the tests' own work)" if rec["xdist"] and not rec["test"] else "python -c"
    if argv[0] == "-m":
        return "-m " + (argv[1] if len(argv) > 1 else "")
    parts = argv[0].replace("\\", "/").split("/")
    if parts[-1] == "__main__.py":  # python -m PACKAGE: the package and its command ('run', '--standby')
        sub = argv[1] if len(argv) > 1 and not argv[1].startswith("/") else ""
        return f"{parts[-2]}/__main__ {sub}".strip()
    return parts[-1]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    rows = [json.loads(line) for line in open(argv[0], encoding="utf-8") if line.strip()]
    cpu, count, by_file = collections.Counter(), collections.Counter(), collections.Counter()
    for r in rows:
        seconds = r["user"] + r["sys"]
        cpu[kind(r)] += seconds
        count[kind(r)] += 1
        by_file[r["test"].split("::")[0] or "(no test)"] += seconds
    print(f"{len(rows)} processes, {sum(cpu.values()):,.0f} CPU seconds")
    print(f"{'CPU s':>8} {'count':>6} {'mean':>6}  kind")
    for k, v in cpu.most_common(25):
        print(f"{v:8.1f} {count[k]:6d} {v / count[k]:6.2f}  {k}")
    print(f"\n{'CPU s':>8}  test file")
    for k, v in by_file.most_common(25):
        print(f"{v:8.1f}  {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
