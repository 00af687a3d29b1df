"""The suite's xdist groups hold (tests/plugins/xdist_groups.py): under ``-n 2 --dist loadgroup`` the tests of one
``xdist_group`` run on one worker. pytest-xdist 3.8.0's own ``@group`` id suffix is not read by pytest 9, and nothing
else would notice that the GUI timing tests run beside each other again."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()


@pytest.mark.xdist_group("groups-check")
@pytest.mark.parametrize("n", range(4))
def test_a_grouped_test(n):
    """One of the grouped tests the check below runs (alone, they check nothing)."""


@pytest.mark.slow  # a pytest run with two xdist workers
def test_one_groups_tests_share_a_worker():
    pytest.importorskip("xdist")
    # a session of its own (its end removes its session folder), not this run's
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PYTEST_") and k not in ("TRAINPILOT_TEST_SESSION", "TRAINPILOT_TEST_TIMES")}
    env["TRAINPILOT_TEST_ZYGOTE"] = "0"  # its tests start no children: no pre-imported server for them
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p",
                           "no:cacheprovider", f"{HERE}::test_a_grouped_test"], capture_output=True, text=True,
                          cwd=HERE.parents[1], timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = re.findall(r"\[(gw\d+)\].*PASSED \S+::test_a_grouped_test\[\d\]", proc.stdout)
    assert len(ran) == 4 and len(set(ran)) == 1, proc.stdout[-3000:]
