"""The data's longest tokenised sample, cached by the data's fingerprint, for the planner (light: no tokenizer here).

Preference, KTO and unpacked supervised runs pad each micro-batch to its longest sequence, and GRPO's update trains
on prompt + completion: their memory follows the data, not ``data.seq_len``. The lengths need the run's tokenizer and
chat template, so they are measured in the worker room — by ``trainpilot-cli data`` (its report), by GRPO's
preflight child (``probes.grpocheck``) and, when ``trainpilot-cli run`` or ``plan`` finds no entry, by one statistics
child (``probes.data_stats``) — and stored here. The planner only reads (``planned_length``): it never tokenises, so
the GUI's verdicts stay instant, and without an entry they plan at ``data.seq_len`` and say so.

The key is the data file's path, size and modification time (or the hub dataset's name and revision), the tokenizer
source and revision, every data setting that changes how records render, the objective, and GRPO's system prompt.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from trainer.data import scan
from trainer.data.demo import cache_dir
from trainer.data.readers import resolve_path

STATS_VERSION = 1  # bump when what is measured changes, so older entries are not trusted
# data settings that do not change a record's rendered tokens
LENGTH_NEUTRAL = ("seq_len", "packing", "shuffle", "num_workers", "validation_split", "validation_path", "skip_bad_lines")


def follows_data(cfg) -> bool:
    """Whether the run's sequences are as long as its data (not always ``data.seq_len``): DPO, KTO, ORPO, GRPO and
    unpacked supervised training of a decoder (packed blocks are seq_len long by construction) — supervised data
    with pictures included, which the worker never packs whatever ``data.packing`` says."""
    objective = cfg.training.objective
    return objective in ("dpo", "kto", "orpo", "grpo") or (
        objective == "sft" and (not cfg.data.packing or has_pictures(cfg)))


def has_pictures(cfg) -> bool:
    """Whether the cached scan of the training file found pictures (False when it was not scanned yet, or for a hub
    dataset: never reads the records)."""
    if cfg.data.hub_dataset:
        return False
    found = scan.cached(cfg.data.path, cfg.data)
    return bool(found is not None and (found.pictures or {}).get("pictures"))


def key(cfg) -> Optional[str]:
    """The cache key of ``cfg``'s training data as the run will tokenise it; None when the data file is missing."""
    d, m = cfg.data, cfg.model
    if d.hub_dataset:
        where = [d.hub_dataset, d.hub_subset, d.hub_split, d.hub_revision]
    else:
        try:
            p = resolve_path(d.path)
            st = p.stat()
        except (OSError, ValueError):
            return None
        where = [str(p.resolve()), st.st_size, st.st_mtime_ns]
    data = {k: v for k, v in d.model_dump().items() if k not in LENGTH_NEUTRAL}
    tok = m.tokenizer or m.source
    parts = [STATS_VERSION, where, data, tok, m.revision, m.architecture, _local_stamp(tok),
             cfg.training.objective, cfg.grpo.system_prompt]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:24]


def _local_stamp(source: Optional[str]) -> Optional[list]:
    """A local tokenizer folder's files' sizes and modification times (a replaced tokenizer changes the key)."""
    if not source:
        return None
    folder = Path(str(source)).expanduser()
    if not folder.is_dir():
        return None
    return sorted([f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in folder.glob("*token*") if f.is_file())


def _file(k: str) -> Path:
    return cache_dir() / "token-stats" / f"{k}.json"


def load(cfg) -> Optional[dict]:
    """The cached statistics of ``cfg``'s data, or None."""
    k = key(cfg)
    if k is None:
        return None
    try:
        return json.loads(_file(k).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def store(cfg, stats: dict) -> None:
    """Cache ``stats`` (token counts: ``longest`` — the longest sample as the objective feeds it —, and for KTO
    and GRPO ``longest_prompt``, for KTO ``longest_completion``; ``records``) for ``cfg``'s data."""
    k = key(cfg)
    if k is None:
        return
    f = _file(k)
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.with_name(f"{f.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(stats), encoding="utf-8")
        os.replace(tmp, f)
    except OSError:
        pass  # a cache that cannot be written only costs the next run this measurement again


@dataclass(frozen=True)
class PlannedLength:
    """The sequence length memory is planned for (tokens) and, in words, where it came from."""

    tokens: int
    from_data: bool
    words: str


def planned_length(cfg) -> PlannedLength:
    """The longest sequence one sample puts through the model: the data's when cached and the objective follows the
    data (capped at ``data.seq_len``, where the run truncates), else ``data.seq_len``."""
    seq = cfg.data.seq_len
    if not follows_data(cfg):
        return PlannedLength(seq, False, "")
    stats = load(cfg)
    longest = _longest(cfg, stats) if stats else None
    if longest is None:
        return PlannedLength(seq, False, f"memory is planned at data.seq_len {seq}: the data's token lengths are not "
                                         f"measured yet ('trainpilot-cli data' measures them, and 'trainpilot-cli run' "
                                         f"does before it plans)")
    tokens = max(1, min(seq, longest))
    cut = f", cut to data.seq_len {seq}" if longest > seq else f" (data.seq_len {seq})"
    return PlannedLength(tokens, True, f"memory is planned at {tokens} tokens per sequence: {_what(cfg, stats)} "
                                       f"is {longest} tokens{cut}")


def _longest(cfg, stats: dict) -> Optional[int]:
    objective = cfg.training.objective
    if objective == "grpo":
        p = stats.get("longest_prompt")
        return None if p is None else int(p) + cfg.grpo.max_completion_length
    if objective == "kto" and stats.get("longest_prompt") is not None:
        return int(stats["longest_prompt"]) + int(stats["longest_completion"])  # KL pairs mix prompts and answers
    value = stats.get("longest")
    return None if value is None else int(value)


def _what(cfg, stats: dict) -> str:
    objective = cfg.training.objective
    if objective == "grpo":
        return (f"the longest prompt ({stats['longest_prompt']} tokens) + grpo.max_completion_length "
                f"({cfg.grpo.max_completion_length})")
    if objective == "kto":
        return "the longest prompt + the longest completion (KTO's KL pairs mix them)"
    if objective in ("dpo", "orpo"):
        return "the data's longest prompt + answer (chosen or rejected)"
    return "the data's longest sample"
