"""``@pytest.mark.xdist_group(name)`` keeps a group's tests on one xdist worker, one after another (the GUI timing
tests; the installers' tests on their one install), under ``--dist loadgroup`` — through public interfaces only.

pytest-xdist 3.8.0 groups a test by the ``@group`` suffix of its id, which it adds by setting ``item._nodeid``;
pytest 9 keeps an item's id elsewhere, so every group was silently ignored. Here each worker writes the groups of
the tests it collected into the session folder before it reports its collection, and the controller's scheduler
(xdist's public ``pytest_xdist_make_scheduler`` hook) hands xdist's own ``LoadGroupScheduling`` the ids with their
suffix. Workers run tests by index, so the ids they report are unchanged. ``tests/test_xdist_groups.py`` checks it."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shared_once import session_root


def _groups_file(worker: str) -> Path:
    return session_root() / f"xdist-groups-{worker}.json"


def _group(item) -> str | None:
    """The group of a test as xdist names it: its ``xdist_group`` names, sorted and joined by "_"."""
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")})
    return "_".join(names) or None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook sends the collection to the controller
def pytest_collection_finish(session):
    config = session.config
    if not hasattr(config, "workerinput") or not getattr(config.option, "loadgroup", False):
        return
    groups = {item.nodeid: g for item in session.items if (g := _group(item))}
    path = _groups_file(config.workerinput["workerid"])
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(groups), encoding="utf-8")
    os.replace(tmp, path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") == "loadgroup":
        return GroupScheduling(config, log)
    return None


class GroupScheduling:
    """xdist's ``LoadGroupScheduling`` (the ``Scheduling`` protocol) fed test ids with their group suffix."""

    def __init__(self, config, log):
        from xdist.scheduler import LoadGroupScheduling

        self._inner = LoadGroupScheduling(config, log)
        self._groups: dict[str, str] = {}  # test id -> group, from the workers' files
        self._plain: dict[str, str] = {}  # suffixed id -> the id the workers report

    def add_node_collection(self, node, collection) -> None:
        path = _groups_file(node.gateway.id)
        if path.exists():
            self._groups.update(json.loads(path.read_text(encoding="utf-8")))
        named = [f"{nodeid}@{self._groups[nodeid]}" if nodeid in self._groups else nodeid for nodeid in collection]
        self._plain.update({n: nodeid for n, nodeid in zip(named, collection) if n != nodeid})
        self._inner.add_node_collection(node, named)

    def mark_test_pending(self, item: str) -> None:
        self._inner.mark_test_pending(f"{item}@{self._groups[item]}" if item in self._groups else item)

    def remove_node(self, node) -> str | None:
        crashed = self._inner.remove_node(node)
        return self._plain.get(crashed, crashed)

    def __getattr__(self, name):  # nodes, collection_is_completed, tests_finished, has_pending, schedule, ...
        return getattr(self._inner, name)
