"""The wizard's controller: the config being built (dotted values), the hardware snapshot, and the
planner run off the GUI thread. Pages bind to it; it never touches widgets."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from PySide6 import QtCore

from app.ops import settings
from app.ops.background import Latest
from app.views.wizard.schema_form import nested
from trainer import config as tc
from trainer.core.dotted import flatten
from app.model.planning import _plan, final_from_plan, longest_for

PLAN_DELAY_MS = 150  # coalesce a burst of edits into one planner call


class WizardState(QtCore.QObject):
    """``values`` is the whole config as {dotted key: value}; ``plan_ready(plan)`` after each re-plan."""
    values_changed = QtCore.Signal(str)       # dotted key ('' for many)
    plan_ready = QtCore.Signal(object)        # trainer.planning.plan.Plan
    problems = QtCore.Signal(list)            # [(dotted key, message)] from the schema or planner
    longest_ready = QtCore.Signal(object)     # trainer.planning.longest.LongestContext, or None (nothing to search)

    def __init__(self, hardware, parent=None):
        super().__init__(parent)
        self.hardware = hardware
        self.values: dict[str, Any] = flatten(tc.to_dict(tc.RunConfig()))
        self.explicit: set[str] = set()  # the keys the user set: only these reach the config as the user's
        self.proposed: set[str] = set()  # keys the wizard chose (a default that follows the model) until the user sets them
        self.plan = None
        self.error: str | None = None
        self._planner = Latest(self._plan_done, self._plan_failed, self)
        self._longest = Latest(self.longest_ready.emit, lambda exc: self.longest_ready.emit(None), self)
        self._timer = QtCore.QTimer(self, singleShot=True, interval=PLAN_DELAY_MS, timeout=self.replan)

    # -- editing --------------------------------------------------------------------------------
    def set(self, key: str, value: Any) -> None:
        """The user set one dotted key: remember it as theirs and schedule a re-plan."""
        self.proposed.discard(key)
        if self.values.get(key) != value:
            self.values[key] = value
            self.explicit.add(key)
            self.values_changed.emit(key)
            self._timer.start()

    def propose(self, key: str, value: Any) -> None:
        """The wizard chose ``value`` for ``key`` (a default that follows the model, said where it is chosen): it goes
        into the config like the user's, and follows again when what it follows changes, until the user sets it."""
        if key in self.explicit and key not in self.proposed:
            return  # the user's value is never replaced
        self.set(key, value)
        self.proposed.add(key)

    def unset(self, key: str) -> None:
        """The user took their value of ``key`` back: the schema's default again, and no longer theirs (the card
        picker's "Use the planner's choice" returns ``distributed.gpus`` to auto, as a config without the key)."""
        self.explicit.discard(key)
        self.proposed.discard(key)
        default = flatten(tc.to_dict(tc.RunConfig())).get(key)
        if self.values.get(key) != default:
            self.values[key] = default
            self.values_changed.emit(key)
        self._timer.start()

    def follows(self, key: str) -> bool:
        """True while ``key`` is not the user's own (the schema's default, or a value the wizard proposed)."""
        return key not in self.explicit or key in self.proposed

    def commit(self, key: str, value: Any) -> None:
        """The user committed ``value`` in a field of ``key``: theirs even when it equals what was shown
        (typing 'false' over the default false means "no DeepSpeed", which a preset must not overrule)."""
        proposed = key in self.proposed
        self.proposed.discard(key)  # typed, even as the same number: the user's from now on
        if key in self.explicit and self.values.get(key) == value and not proposed:
            return
        self.explicit.add(key)
        self.set(key, value) if self.values.get(key) != value else self._timer.start()

    def update(self, values: dict[str, Any]) -> None:
        """The user set several keys at once (the advanced form sends all its fields: only the ones that
        changed become theirs)."""
        changed = {k: v for k, v in values.items() if k not in self.values or self.values[k] != v}
        if not changed:
            return
        self.values.update(changed)
        self.explicit |= set(changed)
        self.proposed -= set(changed)
        self.values_changed.emit("")
        self._timer.start()

    def config(self) -> tc.RunConfig:
        """The config as edited: the user's keys as theirs (``explicit_keys``), every other value the
        schema's default, so a preset layers under what the user left alone and never over what they set
        (ConfigError lists every problem)."""
        return tc.validate(nested({k: self.values[k] for k in self.explicit}))

    def snapshot(self):
        """The hardware snapshot to plan for (None until the probe has answered): this machine's newest, or a
        replayed recording's first moment, as ``trainpilot-cli plan --hardware`` plans it."""
        if self.hardware is None:
            return None
        moment = getattr(self.hardware, "planning_snapshot", None)
        return moment() if callable(moment) else getattr(self.hardware, "latest", None)

    # -- planning -------------------------------------------------------------------------------
    def replan(self) -> None:
        """Validate and plan in the background; emits ``problems`` or later ``plan_ready``."""
        try:
            cfg = self.config()
        except tc.ConfigError as exc:
            self.plan, self.error = None, exc.render()
            self.problems.emit(exc.problems)
            return
        self.problems.emit([])
        snap = self.snapshot()
        if snap is None:  # the probe answers within a second; try again then (no probe: nothing to plan for)
            if self.hardware is not None:
                self._timer.start(500)
            return

        self._planner.submit(lambda: _plan(cfg, snap))
        self._longest.cancel()  # its answer would be for the values before this edit

    def _plan_done(self, plan) -> None:
        self.plan, self.error = plan, None
        self.plan_ready.emit(plan)
        cfg, snap = plan.config_in, self.snapshot()
        if snap is not None:  # the longest context for these values: a dozen plans, after this one is shown
            self._longest.submit(lambda: longest_for(cfg, snap, plan))

    def _plan_failed(self, exc: Exception) -> None:
        self.plan = None
        self.error = exc.render() if isinstance(exc, tc.ConfigError) else f"{type(exc).__name__}: {exc}"
        self.problems.emit(getattr(exc, "problems", None) or [("", self.error)])

    @property
    def planning(self) -> bool:
        """True while a plan is pending."""
        return self._planner.busy or self._timer.isActive()

    # -- output ---------------------------------------------------------------------------------
    def final_config(self, plan=None) -> tc.RunConfig:
        """The planned config (autos resolved, preset recorded) from ``plan`` (default: the last
        background plan when it is for the current values). Never plans: planning runs off the GUI
        thread (``review_check`` on the Review page); without a matching plan, the config as edited."""
        cfg = self.config()
        plan = plan if plan is not None else self.plan
        return final_from_plan(cfg, plan)

    def default_run_dir(self) -> str:
        """``<runs_dir>/<name>-<yyyymmdd-hhmmss>``."""
        name = self.values.get("name") or "run"
        return str(settings.runs_dir() / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")

    def write_config(self, run_dir: str, cfg: tc.RunConfig | None = None) -> Path:
        """Write ``cfg`` (default: ``final_config()``) next to the runs (``<home>/configs/<run>.yaml``).
        Returns its path."""
        folder = settings.home() / "configs"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{Path(run_dir).name}.yaml"
        path.write_text(tc.dump_yaml(cfg if cfg is not None else self.final_config()), encoding="utf-8")
        return path
