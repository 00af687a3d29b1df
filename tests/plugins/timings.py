"""Where the suite's time goes, readable while it runs: a test phase over ``SLOW_LINE_S`` is named in the output as
it ends (when CI is cut off at its time limit, the log's tail still says where the time went), and with
``TRAINPILOT_TEST_TIMES=FILE`` every phase's duration is appended to FILE (one line per phase: seconds, phase,
outcome, test id, xdist worker). Written by the controller only: xdist hands it every worker's reports."""
from __future__ import annotations

import os

from plugins.session import is_controller

SLOW_LINE_S = 60.0  # locally the slowest test takes ~90 s (seconds)
_CONFIG: list = [None]  # set in the controller only


def pytest_configure(config):
    if is_controller(config):
        _CONFIG[0] = config


def pytest_runtest_logreport(report):
    config = _CONFIG[0]
    if config is None:
        return
    if report.duration >= SLOW_LINE_S:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"[{report.duration:.0f} s {report.when}] {report.nodeid}")
    out = os.environ.get("TRAINPILOT_TEST_TIMES")
    if out:
        worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "main")
        with open(out, "a", encoding="utf-8") as f:
            f.write(f"{report.duration:.2f}\t{report.when}\t{report.outcome}\t{report.nodeid}\t{worker}\n")
