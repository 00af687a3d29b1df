"""What Review must know before Start is enabled (no Qt; runs off the GUI thread): the plan for the
current values, the final config, and every blocking problem with its fix, each on its field."""
from __future__ import annotations

from dataclasses import dataclass, field

from app.model import hub
from app.model.fmt import gib
from app.model.planning import final_from_plan
from trainer import config as tc
from trainer.core.errors import UserError
from trainer.models import sources
from trainer.supervisor import preflight as pf


@dataclass
class ReviewResult:
    """The final config and the problems that block Start (``blocking``: (field, message)) or
    only deserve a word (``warnings``: text saying what will happen)."""

    config: tc.RunConfig | None = None
    plan: object = None
    blocking: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def review_check(cfg: tc.RunConfig, plan, snapshot, run_dir: str | None = None) -> ReviewResult:
    """Everything Start would refuse for ``cfg`` in ``run_dir`` (``preflight.start_problems``: inputs, plan,
    this machine's packages and GPU, the run folder), plus what the wizard asks before it: a plan that does
    not fit, a model that is not downloaded. ``plan`` is reused when it was made for ``cfg``."""
    out = ReviewResult()
    if plan is not None and getattr(plan, "config_in", None) != cfg:
        plan = None
    try:
        ready = pf.start_problems(cfg, snapshot, run_dir=run_dir, plan=plan)
    except Exception as exc:  # e.g. no hardware snapshot yet: say so instead of a traceback
        out.config = cfg
        out.blocking.append(("", f"the checks could not run ({type(exc).__name__}: {exc})"))
        return out
    out.plan = ready.plan
    if out.plan is not None:
        out.plan.config_in = cfg
    out.config = final_from_plan(cfg, out.plan)
    out.blocking = list(ready.problems)
    out.blocking += [p for p in model_problems(cfg) if p not in out.blocking]
    fit = fit_problem(out.plan)
    if fit:
        out.blocking.append(fit)
    elif out.plan is not None and out.plan.verdict == "tight":
        out.warnings.append("The plan fits, but tightly: if memory runs out, TrainPilot lowers the micro-batch and "
                            "continues from the last checkpoint (the effective batch stays the same).")
    return out


def fit_problem(plan) -> tuple[str, str] | None:
    """('method.type', why and what would fit) when the planner says the run does not fit."""
    if plan is None or plan.verdict != "does_not_fit":
        return None
    d = plan.to_dict()
    alts = [a.get("description") for a in d.get("alternatives") or [] if isinstance(a, dict) and a.get("description")]
    fix = f" What would fit: {alts[0]}." if alts else " Choose a smaller model, LoRA or QLoRA, or a shorter sequence."
    return ("method.type", f"does not fit: predicted peak {gib(d.get('predicted_peak_bytes'))} of a "
                           f"{gib(d.get('budget_bytes'))} budget on this GPU.{fix}")


def model_problems(cfg: tc.RunConfig) -> list[tuple[str, str]]:
    """A shipped architecture used as a model, an architecture without a tokenizer, and a hub model
    or tokenizer that is not downloaded (nothing downloads without the user's OK)."""
    m = cfg.model
    out = []
    if not m.architecture and m.source != sources.DEMO_MODEL and not sources.is_local(m.source) \
            and hub.is_shipped_architecture(m.source):
        out.append(("model.source", f"'{m.source}' is a shipped architecture (random weights, no tokenizer), not a "
                                    "model with weights. Pick it from the list on the Model page (random weights — "
                                    "for testing), or choose a real model."))
        return out
    if not m.architecture and m.source != sources.DEMO_MODEL and not sources.is_local(m.source) \
            and not hub.is_cached(m.source, m.revision):
        out.append(("model.source", f"{m.source} is not downloaded yet. Download it on the Model page (it asks "
                                    "first and shows the size)."))
    tok = sources.tokenizer_source(cfg)
    if m.architecture and tok not in ("demo", None):
        if sources.is_local(tok):
            try:
                sources.check_tokenizer_source(cfg)
            except UserError as exc:
                out.append(("model.tokenizer", str(exc).partition(": ")[2] or str(exc)))
        elif hub.is_shipped_architecture(tok):
            out.append(("model.tokenizer", f"architecture '{m.architecture}' has random weights and no tokenizer; "
                                           "set the tokenizer to 'demo' (the bundled one, for testing) or to a "
                                           "downloaded model's tokenizer."))
        elif not hub.is_cached(tok, None):
            out.append(("model.tokenizer", f"the tokenizer {tok} is not downloaded; download that model on the Model "
                                           "page or set the tokenizer to 'demo' (bundled, for testing)."))
    return out
