"""One fit verdict: for a model and this machine, per method (full / LoRA / QLoRA), does it fit, not
fit, or need something this machine lacks, with the planned peak and the budget in bytes.

The model page, the picker and the plan page all ask ``model_verdict`` (or ``method_verdict`` for a
plan already made), so one model gets one answer everywhere. A verdict is the planner's (``plan_run``
on the config with only the model and the method changed: your explicit settings still hold) plus
``trainer.planning.requirements`` (what Start would refuse: QLoRA without bitsandbytes says "needs
bitsandbytes", not "fits"). Light: no torch; a plan takes milliseconds to seconds (big models).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from trainer import config as config_mod
from trainer.config import in_backward
from trainer.config.placements import PLACEMENTS, Placement, placement
from trainer.core import capabilities
from trainer.core.errors import UserError
from trainer.models.spec import load_model_spec
from trainer.planning import requirements
from trainer.planning.plan import plan_run

METHODS = ("full", "lora", "qlora")
VERDICTS = ("fits", "tight", "does_not_fit", "needs", "unknown")
WORDS = {"fits": "fits", "tight": "fits (tight)", "does_not_fit": "does not fit", "unknown": "unknown"}


@dataclasses.dataclass(frozen=True)
class MethodVerdict:
    """One method's verdict (one of VERDICTS). ``needs``: what this machine lacks (verdict 'needs');
    ``peak_bytes``/``budget_bytes``: the planned peak and the memory budget (VRAM, or host RAM on the CPU)."""

    method: str
    verdict: str
    needs: tuple[str, ...] = ()
    peak_bytes: Optional[int] = None
    budget_bytes: Optional[int] = None
    device: Optional[str] = None
    reasons: tuple[str, ...] = ()
    plan: Any = dataclasses.field(default=None, repr=False, compare=False)  # the Plan behind it, if any

    @property
    def fits(self) -> bool:
        """True for 'fits' and 'tight'."""
        return self.verdict in ("fits", "tight")

    @property
    def words(self) -> str:
        """'fits', 'fits (tight)', 'does not fit', 'needs bitsandbytes', 'unknown'."""
        return "needs " + " and ".join(self.needs) if self.verdict == "needs" else WORDS[self.verdict]

    @property
    def click_changes(self) -> dict:
        """What one click on this option writes: its changes, at the smaller effective batch where only that fits."""
        if self.verdict == "fits" or self.smaller_batch is None:
            return dict(self.changes)
        return {**self.changes, "training.effective_batch_size": self.smaller_batch}

    def to_dict(self) -> dict:
        """JSON-ready (the plan left out)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "plan"}


@dataclasses.dataclass(frozen=True)
class ModelVerdict:
    """Every method's verdict for one model; ``seq_len`` is the sequence length judged (the config's,
    capped at the model's maximum positions); ``error`` says why the model could not be judged."""

    source: str
    params: Optional[int]
    encoder_decoder: Optional[bool]
    seq_len: Optional[int]
    methods: dict
    error: Optional[str] = None

    def best(self) -> Optional[MethodVerdict]:
        """The first method that fits, in the order full, LoRA, QLoRA (the most faithful first), or None."""
        return next((v for v in self.methods.values() if v.fits), None)

    def to_dict(self) -> dict:
        """JSON-ready."""
        return {"source": self.source, "params": self.params, "encoder_decoder": self.encoder_decoder,
                "seq_len": self.seq_len, "error": self.error,
                "methods": {m: v.to_dict() for m, v in self.methods.items()}}


def method_verdict(plan, hardware) -> MethodVerdict:
    """The verdict of a plan already made for a config (the plan page): the planner's verdict, or
    'needs' when the planned config needs what this machine lacks."""
    resolved = getattr(plan, "resolved", None)
    # What no method could change (a CPU-only PyTorch beside a GPU) is Start's refusal, not this method's verdict.
    unmet = [r for r in requirements.unmet(resolved, hardware) if not r.every_method] if resolved is not None else []
    method = resolved.method.type if resolved is not None else "?"
    verdict = "needs" if unmet else plan.verdict
    return MethodVerdict(method, verdict, tuple(dict.fromkeys(r.needs for r in unmet)),
                         plan.predicted_peak_bytes, plan.budget_bytes, plan.device,
                         tuple(r.message for r in unmet) + tuple(plan.reasons), plan)


def model_verdict(cfg, hardware, source: Optional[str] = None, methods=METHODS) -> ModelVerdict:
    """Per method, does ``source`` (a hub id, folder or shipped architecture; default: the config's model)
    fit on ``hardware`` (a MachineSnapshot) when trained as ``cfg`` says? Nothing downloads: a hub model
    is judged from its config.json in the cache or its shipped architecture."""
    base = cfg
    if source is not None and source != cfg.model.source:
        base = config_mod.replace(cfg, **{"model.source": source, "model.architecture": None,
                                          "model.tokenizer": None})
    name = base.model.architecture or base.model.source
    try:
        spec = load_model_spec(name)
    except UserError as exc:
        return ModelVerdict(base.model.source, None, None, None, {}, str(exc))
    seq = min(base.data.seq_len, spec.max_positions or base.data.seq_len)
    out = {}
    with capabilities.one_look():  # the methods' plans and requirement checks see one look at the packages
        for method in methods:
            out[method] = _one(base, hardware, method, seq)
    return ModelVerdict(base.model.source, spec.params, spec.encoder_decoder, seq, out)


def _one(cfg, hardware, method: str, seq: int) -> MethodVerdict:
    try:
        variant = config_mod.replace(cfg, **{"method.type": method, "data.seq_len": seq})
        return method_verdict(plan_run(variant, hardware, alternatives=False), hardware)  # a verdict needs none
    except (UserError, config_mod.ConfigError) as exc:  # a combination the config cannot express
        return MethodVerdict(method, "unknown", reasons=(str(exc),))


# -- a full fine-tune's optimizer: the separate step, or the step fused into backward with each state placement ------
@dataclasses.dataclass(frozen=True)
class StepOption:
    """One way to run a full fine-tune's optimizer (issue 39): ``changes`` (dotted keys) make a config run it;
    ``verdict``/``peak_bytes``/``budget_bytes`` are the planner's for it, judged as ``method_verdict`` judges a plan
    (verdict 'needs' with ``needs``: what this machine lacks, as bitsandbytes for its placements); ``approximate``
    where its states are 8-bit; ``consequence`` what it changes, in words."""

    key: str
    words: str
    changes: dict
    approximate: bool
    consequence: str
    verdict: str = "unknown"
    peak_bytes: Optional[int] = None
    budget_bytes: Optional[int] = None
    host_ram_bytes: Optional[int] = None  # host RAM the plan needs (paged states live there)
    host_ram_available_bytes: Optional[int] = None
    needs: tuple[str, ...] = ()
    # where it does not fit at your effective batch: the largest one the fused step keeps exact in one micro-batch
    # (``planning.search.largest_in_backward_batch``) and the peak there; None where none fits (or it fits as it is)
    smaller_batch: Optional[int] = None
    smaller_batch_peak_bytes: Optional[int] = None

    @property
    def verdict_words(self) -> str:
        """'fits', 'fits (tight)', 'does not fit', 'needs bitsandbytes', 'unknown'."""
        return "needs " + " and ".join(self.needs) if self.verdict == "needs" else WORDS[self.verdict]

    @property
    def click_changes(self) -> dict:
        """What one click on this option writes: its changes, at the smaller effective batch where only that fits."""
        if self.verdict == "fits" or self.smaller_batch is None:
            return dict(self.changes)
        return {**self.changes, "training.effective_batch_size": self.smaller_batch}


FUSED = {**in_backward.changes("auto"), "deepspeed.enabled": False}  # the planner makes the micro-batch the batch
FUSED_WORDS = "the step fused into backward: no gradient clipping, the whole batch in one micro-batch"
APPROXIMATE_WORDS = "approximate: 8-bit optimizer states (updates differ slightly from fp32 AdamW)"


def _fused_option(p: Placement) -> tuple:
    """The Method page's option for the step fused into backward with ``p``'s states."""
    consequence = ("exact" if p.exact else APPROXIMATE_WORDS) + f"; {FUSED_WORDS}" + \
        ("; PCIe time for the states" if p.paged else "")
    return p.name, f"step fused into backward, {p.placed}", {**FUSED, "training.optimizer": p.name}, not p.exact, \
        consequence


STEP_OPTIONS = (
    ("separate", "optimizer step after backward", {"training.optimizer_in_backward": False}, False,
     "the usual step: every gradient kept until it runs"),
    *(_fused_option(p) for p in PLACEMENTS),
)


def step_options(cfg, hardware) -> list[StepOption]:
    """For a full fine-tune of ``cfg`` on ``hardware``: the verdict of the separate step and of the step fused into
    backward with each state placement (bitsandbytes' on a GPU only). Empty for LoRA/QLoRA. Seconds for big models:
    call it off the GUI thread."""
    if cfg.method.type != "full":
        return []
    gpu = bool(getattr(hardware, "gpus", None)) and cfg.device != "cpu"
    out = []
    for key, words, changes, approximate, consequence in STEP_OPTIONS:
        if key != "separate" and placement(key).cuda_only and not gpu:
            continue
        option = StepOption(key, words, changes, approximate, consequence)
        try:
            plan = plan_run(config_mod.replace(cfg, **changes), hardware, alternatives=False)
        except (UserError, config_mod.ConfigError):  # your settings rule it out (clipping, DeepSpeed, several GPUs)
            out.append(option)
            continue
        judged = method_verdict(plan, hardware)  # the one verdict's rule: a placement needing bitsandbytes "needs" it
        smaller = getattr(plan.choice, "largest_in_backward", None) if judged.verdict not in ("fits", "needs") else None
        out.append(dataclasses.replace(option, verdict=judged.verdict, needs=judged.needs,
                                       peak_bytes=plan.predicted_peak_bytes, budget_bytes=plan.budget_bytes,
                                       host_ram_bytes=plan.host_ram_needed_bytes,
                                       host_ram_available_bytes=plan.host_ram_available_bytes,
                                       smaller_batch=smaller[0] if smaller else None,
                                       smaller_batch_peak_bytes=smaller[1] if smaller else None))
    return out


def one_click_offer(options: list[StepOption]) -> Optional[StepOption]:
    """The option to offer in one click where no exact one fits (None when one does, or nothing would fit): an
    approximate one that fits at your effective batch, else the fused option that fits at the largest smaller
    effective batch (exact before approximate at the same batch; the click sets that batch,
    ``StepOption.click_changes``). Never a click whose plan does not fit."""
    if any(o.verdict == "fits" and not o.approximate for o in options):
        return None
    fitting = [o for o in options if o.approximate and o.verdict == "fits"]
    if fitting:
        return fitting[0]
    smaller = [o for o in options if o.smaller_batch is not None and o.verdict != "needs"]
    return max(smaller, key=lambda o: (o.smaller_batch, not o.approximate), default=None)
