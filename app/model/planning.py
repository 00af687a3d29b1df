"""The wizard's planning (plain Python, no Qt; call it off the GUI thread: seconds for big models):
the plan for a config, and the sequence length refused where it is typed. The fit verdicts the Model
page, the picker's rows and the Plan page show are ``trainer.planning.verdict``'s (one function)."""
from __future__ import annotations

from trainer import config as tc
from trainer.core.errors import UserError
from trainer.models.spec import spec_for_run
from trainer.planning.ladder import record_kept_settings
from trainer.planning.longest import LongestContext, longest_context
from trainer.planning.plan import plan_run
from trainer.planning.verdict import method_verdict
from trainer.supervisor import preflight


def final_from_plan(cfg: tc.RunConfig, plan) -> tc.RunConfig:
    """``plan``'s resolved config when the plan was made for ``cfg`` (preset recorded), else ``cfg`` with the
    settings the user gave a value written into ``recovery.ladder_keeps`` (the written file sets every key, so the
    CLI could no longer tell which were the user's: the OOM ladder would keep them all)."""
    if plan is None or getattr(plan, "config_in", None) != cfg or getattr(plan, "resolved", None) is None:
        return record_kept_settings(cfg)
    resolved = plan.resolved
    return resolved if resolved.preset or not plan.preset else tc.replace(resolved, preset=plan.preset)


def _plan(cfg: tc.RunConfig, snapshot):
    """Plan ``cfg`` for ``snapshot``; the plan remembers which config it was made for and carries its
    ``method_verdict`` (``trainer.planning.verdict``: 'needs bitsandbytes' as well as fits). Raises ConfigError
    (shown beside the field) for a value the model cannot take, e.g. a sequence beyond its positions."""
    problem = seq_len_problem(cfg)
    if problem:
        raise tc.ConfigError([problem])
    plan = plan_run(cfg, snapshot)
    plan.config_in = cfg
    plan.method_verdict = method_verdict(plan, snapshot)  # the verdict the Model page and the picker show
    return plan


def seq_len_limit(cfg: tc.RunConfig) -> int | None:
    """The most positions ``cfg``'s model reads (max_position_embeddings, tokens); None when unknown."""
    try:
        return spec_for_run(cfg).max_positions or None
    except UserError:  # no config.json here yet: the planner says "unknown" and Review names the download
        return None


def proposed_seq_len(limit: int | None) -> int:
    """The sequence length the wizard proposes for a model that reads ``limit`` positions (tokens) while the user has
    not set one: the schema's default, or the model's limit when it reads fewer (a default the model refuses is no
    default: the 512-position demo model and 2048)."""
    default = tc.DataConfig.model_fields["seq_len"].default
    return min(default, limit) if limit else default


def seq_len_problem(cfg: tc.RunConfig) -> tuple[str, str] | None:
    """('data.seq_len', why and the fix) when the sequence is longer than the model reads; never changed."""
    why = preflight.seq_len_refusal(cfg.data.seq_len, seq_len_limit(cfg), name="the sequence length")
    return ("data.seq_len", why) if why else None


def longest_for(cfg: tc.RunConfig, snapshot, plan) -> LongestContext | None:
    """The longest sequence ``cfg`` fits on ``snapshot`` with the settings the planner would choose, and with the
    programs holding VRAM closed (``trainer.planning.longest``; a dozen plans: call it off the GUI thread). None where
    there is nothing to search: no GPU, or a model whose memory cannot be predicted (``plan``'s verdict)."""
    if plan is None or plan.device != "cuda" or plan.verdict == "unknown" or not snapshot.gpus:
        return None
    return longest_context(cfg, snapshot)


def longest_words(found: LongestContext | None) -> str:
    """The Method page's line: "Longest context with these settings: 39,936 tokens; 53,248 with firefox closed"."""
    if found is None:
        return ""
    return f"Longest context with these settings: {found.words()}"
