"""Skips that cannot hide a missing tool in CI. Locally a test that needs an optional tool (bash, a Debian
package, a Python module) skips and says why; where ``CI`` is set (``.ci/run`` sets it, as GitHub Actions and
most CI services do) the same condition fails the test, so a feature whose tool went missing is never reported
as passing."""
from __future__ import annotations

import importlib
import os
import shutil

import pytest


def in_ci() -> bool:
    """True on a CI machine (``CI`` set to anything but empty, 0, false or no)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require(condition: bool, reason: str) -> None:
    """Go on when ``condition`` holds; else skip with ``reason`` locally and fail in CI."""
    if condition:
        return
    if in_ci():
        pytest.fail(f"{reason}: CI must provide it (a skip here would pass a test that checked nothing)")
    pytest.skip(reason)


def require_tool(exe: str, how: str) -> str:
    """The path of the program ``exe``; ``how`` says how to get it."""
    path = shutil.which(exe)
    require(path is not None, f"{exe} is not installed ({how})")
    return path


def require_module(module: str, how: str):
    """The imported ``module``; ``how`` says how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        require(False, f"{module} is not importable ({how})")


def zygote_possible() -> bool:
    """fork and pidfds (Linux 5.3 and later), which the test session's zygote (``tests/zygote``) needs: without them
    every child starts as usual (the suite is slower, not wrong), and ``tests/test_zygote.py`` skips."""
    try:
        os.close(os.pidfd_open(os.getpid()))
        return hasattr(os, "fork")
    except (AttributeError, OSError):
        return False
