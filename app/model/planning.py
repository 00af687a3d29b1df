"""The wizard's planning (plain Python, no Qt; call it off the GUI thread: seconds for big models):
the plan for a config, and the sequence length refused where it is typed. The fit verdicts the Model
page, the picker's rows and the Plan page show are ``trainer.planning.verdict``'s (one function)."""
from __future__ import annotations

from trainer import config as tc
from trainer.core.units import GIB, count, gib
from trainer.models import vision
from trainer.planning import picture_memory as pictures
from trainer.planning.ladder import record_kept_settings
from trainer.planning.longest import LongestContext, longest_context
from trainer.models.positions import run_position_limit as seq_len_limit  # the one reader (the wizard's name)
from trainer.planning.plan import plan_run
from trainer.planning.verdict import method_verdict, step_options
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
    plan.step_options = step_options(cfg, snapshot)  # a full fine-tune's optimizer step and states (issue 39)
    return plan


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


TRAIN_VISION_WORDS = {"none": "nothing (the vision tower and projector stay frozen)", "projector": "the projector",
                      "all": "the projector and the vision tower"}


def picture_cost_words(pictures: dict, micro_batch: int | None) -> str:
    """What a picture costs in a plan (plan.json's ``pictures``), in one line of HTML: its tokens, the pictures a
    sample brings, its share of the peak at the planned micro-batch, and how pictures are sized."""
    if not pictures:
        return ""
    per, tokens = pictures["per_sample"], pictures["tokens_per_picture"]
    source = "measured in the data" if pictures.get("from_data") else "the most the processor makes of a picture"
    cost = pictures.get("bytes_per_picture")
    size = f"≈{cost / 2**30:.2f} GiB</b> at micro-batch {micro_batch}" if cost is not None else \
        "as long as the whole sequence</b>"
    line = f"<b>A picture: {tokens:,} tokens, {size} ({source}); {per} per sample ({per * tokens:,} tokens)"
    parts = pictures.get("bytes_per_picture_parts") or {}
    shown = [(k, v) for k, v in parts.items() if v >= GIB / 100]  # (the bar's own hundredths of a GiB)
    if cost is not None and shown:  # where it lies in the bar: its parts of the components drawn there
        line += "; in the bar: " + ", ".join(f"{gib(v, 2)} of {k.replace('_', ' ')}" for k, v in shown)
    if pictures.get("vision_activation_bytes"):
        line += f"; the vision side keeps {pictures['vision_activation_bytes'] / 2**30:.2f} GiB of activations"
    sizing = pictures.get("image_max_pixels") or pictures.get("processor")
    if pictures.get("tokens_over_seq_len"):
        cap = pictures.get("suggested_image_max_pixels")
        fix = f"set Largest picture to {cap:,} pixels or less, or " if cap else ""
        line += (f"<br><span style='color:#b00'>a sample's {per} picture(s) fill the sequence: {fix}raise the sequence "
                 f"length</span>")
    return line + (f"<br><span style='color:#555'>{sizing[:1].upper() + sizing[1:]}</span>" if sizing else "")


def vision_words(spec) -> str:
    """A vision-language model's vision side in one line: its tower and projector, and the most tokens one picture
    takes with its processor's own settings (counted in the plan once the data is chosen)."""
    v = spec.vision
    p = pictures.processor_of(spec)
    most = f"; a picture takes up to {vision.largest(p).tokens:,} tokens ({vision.describe(p)})" if p else \
        "; its pictures' tokens are not counted by the planner (a family it does not know)"
    return (f"Takes pictures: a {count(v['tower_params'])}-parameter vision tower and a {count(v['projector_params'])} "
            f"projector, frozen unless the Method page trains them{most}.")


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
