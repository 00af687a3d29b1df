"""The resolved config: a ``RunConfig`` with no ``"auto"`` left, typed so.

Which fields may be ``"auto"`` is read off the schema (``AUTO_FIELDS``), never restated. The resolved
types are derived from the schema too: ``ResolvedRunConfig`` is ``RunConfig`` with ``"auto"`` removed
from every annotation, so ``cfg.training.micro_batch_size`` is an ``int`` and ``cfg.speed.precision``
one of bf16/fp16/fp32. The planner resolves (``trainer.planning.plan``); the worker, the exported
scripts and ``plan --measure`` take the resolved config and decide nothing again.

The rules that turn an ``"auto"`` into a value live here, once: precision (and the weights' dtype
that follows it), and the launcher.
"""
from __future__ import annotations

import types
import typing
from typing import Literal, Optional, Union

from pydantic import BaseModel, create_model

from trainer.config.loading import read_yaml, validate
from trainer.config.sections import DETECTED, PLANNED_FOR_GRPO, PLANNED_GPUS, PLANNED_SPLIT, YOUR_SETTINGS, RunConfig
from trainer.core.dotted import get_in, set_in
from trainer.core.errors import UserError

AUTO = "auto"


def _is_union(annotation) -> bool:
    return typing.get_origin(annotation) in (Union, types.UnionType)


def _admits_auto(annotation) -> bool:
    if typing.get_origin(annotation) is Literal:
        return AUTO in typing.get_args(annotation)
    if _is_union(annotation):
        return any(_admits_auto(a) for a in typing.get_args(annotation))
    return False


def _without_auto(annotation):
    """The annotation with the ``"auto"`` choice removed (``Union[int, Literal['auto']]`` → ``int``)."""
    if typing.get_origin(annotation) is Literal:
        rest = tuple(a for a in typing.get_args(annotation) if a != AUTO)
        return Literal[rest] if rest else annotation
    if not _is_union(annotation):
        return annotation
    parts = [_without_auto(a) for a in typing.get_args(annotation)
             if not (typing.get_origin(a) is Literal and typing.get_args(a) == (AUTO,))]
    return parts[0] if len(parts) == 1 else Union[tuple(parts)]


def _sections() -> dict[str, type[BaseModel]]:
    out = {}
    for name, field in RunConfig.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out[name] = ann
    return out


def auto_fields() -> tuple[str, ...]:
    """Dotted keys whose type admits ``"auto"``, read off the schema."""
    out = [k for k, f in RunConfig.model_fields.items() if _admits_auto(f.annotation)]
    for section, model in _sections().items():
        out += [f"{section}.{k}" for k, f in model.model_fields.items() if _admits_auto(f.annotation)]
    return tuple(out)


AUTO_FIELDS = auto_fields()


def _field(key: str):
    *head, last = key.split(".")
    model = RunConfig
    for part in head:
        model = model.model_fields[part].annotation
    return model.model_fields[last]


# Fields whose "auto" is detected from the input when it is used (marked DETECTED in the schema: a
# file's type, the records' shape, a webhook's format) stay "auto" in a resolved config; every other
# auto field is the planner's to resolve.
# A field one objective reads (PLANNED_FOR_GRPO) may stay "auto" too: the planner resolves it for that objective, and
# the worker falls back to TRL's default if a hand-made config leaves it. The cards (PLANNED_GPUS) likewise: the planner
# writes them, a config that leaves them "auto" shows the worker every card; the split of the layers over them
# (PLANNED_SPLIT) too: "auto" left in a resolved config trains data-parallel (even shares where it splits). The user's own settings (YOUR_SETTINGS: which
# the OOM ladder keeps) are resolved when a run is created; a run folder older than the field keeps "auto".
RESOLVED_WHEN_READ = tuple(k for k in AUTO_FIELDS
                           if (_field(k).json_schema_extra or {}) in (DETECTED, PLANNED_FOR_GRPO, YOUR_SETTINGS,
                                                                      PLANNED_GPUS, PLANNED_SPLIT))
PLANNER_FIELDS = tuple(k for k in AUTO_FIELDS if k not in RESOLVED_WHEN_READ)


def _resolved_model(model: type[BaseModel], name: str, fields: dict, prefix: str = "") -> type[BaseModel]:
    overrides = {k: (_without_auto(f.annotation), f) for k, f in model.model_fields.items()
                 if f"{prefix}{k}" in PLANNER_FIELDS}
    overrides.update(fields)
    return create_model(name, __base__=model, **overrides) if overrides else model


def _build_resolved() -> type[RunConfig]:
    sections = {}
    for section, model in _sections().items():
        resolved = _resolved_model(model, f"Resolved{model.__name__}", {}, prefix=f"{section}.")
        if resolved is not model:
            sections[section] = (resolved, RunConfig.model_fields[section])
    return _resolved_model(RunConfig, "ResolvedRunConfig", sections)


ResolvedRunConfig = _build_resolved()


def unresolved(cfg: RunConfig) -> list[str]:
    """The dotted keys of ``cfg`` that are still ``"auto"``."""
    data = cfg.model_dump()
    left = []
    for key in PLANNER_FIELDS:
        node = data
        for part in key.split("."):
            node = node[part]
        if node == AUTO:
            left.append(key)
    return left


def as_resolved(cfg: RunConfig) -> ResolvedRunConfig:
    """``cfg`` typed as resolved; UserError naming the first field still ``"auto"``."""
    if isinstance(cfg, ResolvedRunConfig):
        return cfg
    left = unresolved(cfg)
    if left:
        raise UserError(f"{left[0]}: could not be resolved for this machine; set it explicitly "
                        f"(still 'auto': {', '.join(left)})", field=left[0])
    out = ResolvedRunConfig.model_validate(cfg.model_dump())
    out._explicit = cfg._explicit
    return out


# Planner fields added after earlier releases wrote their run folders, and the value those runs had before the field
# existed: an older run folder resumes, chats and exports as it ran instead of stopping at a field still "auto".
BEFORE_THE_FIELD = {"speed.tiled_mlp": False}


def load_resolved(path) -> ResolvedRunConfig:
    """A run directory's ``config.yaml`` (written resolved by the supervisor; fields it predates read as they were:
    ``BEFORE_THE_FIELD``)."""
    data = read_yaml(path)
    for key, value in BEFORE_THE_FIELD.items():
        if isinstance(data, dict) and _absent(data, key):
            set_in(data, key, value)
    return as_resolved(validate(data, source=str(path)))


def _absent(data: dict, key: str) -> bool:
    *head, last = key.split(".")
    node = get_in(data, ".".join(head), {}) if head else data
    return not isinstance(node, dict) or last not in node


# -- the rules, once ----------------------------------------------------------------------------
def resolve_precision(requested: str, device: str, compute_capability: Optional[str]) -> str:
    """bf16, fp16 or fp32. ``auto``: fp32 on the CPU, bf16 on GPUs of compute capability 8.0 and
    newer (Ampere: RTX 30xx and later), fp16 on older GPUs. An explicit value is kept."""
    if requested != AUTO:
        return requested
    if device != "cuda":
        return "fp32"
    major = int(str(compute_capability or "0").split(".")[0] or 0)
    return "bf16" if major >= 8 else "fp16"


def resolve_dtype(requested: str, precision: str) -> str:
    """The dtype weights are loaded in. ``auto`` follows the precision: bf16 weights under bf16 mixed
    precision (pure bf16 memory), float32 master weights under fp16 (AMP needs them) and fp32."""
    if requested != AUTO:
        return requested
    return "bfloat16" if precision == "bf16" else "float32"


def resolve_launcher(cfg: RunConfig) -> str:
    """'single', 'torchrun' or 'deepspeed': one process for one GPU; several go through the DeepSpeed
    launcher when DeepSpeed is on (or several machines), torchrun otherwise, unless set."""
    d = cfg.distributed
    if cfg.world_size == 1:
        return "single"
    if d.launcher != AUTO:
        return d.launcher
    if d.num_nodes > 1 or (cfg.deepspeed.enabled is True and cfg.device == "cuda"):
        return "deepspeed"
    return "torchrun"


__all__ = ["AUTO_FIELDS", "PLANNER_FIELDS", "RESOLVED_WHEN_READ", "ResolvedRunConfig", "as_resolved", "auto_fields", "load_resolved", "resolve_dtype",
           "resolve_launcher", "resolve_precision", "unresolved", "validate"]
