"""The wizard's plan for a config (plain Python, no Qt; call it off the GUI thread: seconds for big models)."""
from __future__ import annotations

from trainer import config as tc
from trainer.planning.plan import plan_run


def final_from_plan(cfg: tc.RunConfig, plan) -> tc.RunConfig:
    """``plan``'s resolved config when the plan was made for ``cfg`` (preset recorded), else ``cfg``."""
    if plan is None or getattr(plan, "config_in", None) != cfg:
        return cfg
    resolved = getattr(plan, "resolved", None)
    if resolved is None:
        return cfg
    return resolved if resolved.preset or not plan.preset else tc.replace(resolved, preset=plan.preset)


def plan_for(cfg: tc.RunConfig, snapshot):
    """Plan ``cfg`` for ``snapshot`` (seconds of CPU for big models: call it off the GUI thread)."""
    return _plan(cfg, snapshot)


def _plan(cfg: tc.RunConfig, snapshot):
    """Plan ``cfg`` for ``snapshot``; the plan remembers which config it was made for."""
    plan = plan_run(cfg, snapshot)
    plan.config_in = cfg
    return plan

