"""The model picker's rows (no Qt; off the GUI thread): popular open models (``trainer.models.catalog``)
and hub search results, each with its parameter count, download size, the fit verdict per method on
this machine (``trainer.planning.verdict.model_verdict``: the Model and Plan pages' answer) and whether
it is on this computer."""
from __future__ import annotations

from typing import Callable

from huggingface_hub import HfApi, hf_hub_download

from app.model import hub
from trainer import config as tc
from trainer.core import capabilities
from trainer.models import catalog
from trainer.planning.verdict import METHODS, model_verdict

SEARCH_LIMIT = 15


def row(repo: str, base_cfg: tc.RunConfig, snapshot) -> dict:
    """{'repo', 'here', 'params', 'bytes' (bf16 download), 'verdict' (ModelVerdict), 'error'} for one hub
    model, judged as ``base_cfg`` would train it (only the model changed, as a click on the row does)."""
    v = model_verdict(base_cfg, snapshot, source=repo)
    out = {"repo": repo, "here": hub.cached_state(repo), "verdict": v}
    if v.error:
        out["error"] = v.error.splitlines()[0][:120]
    else:
        out.update(params=v.params, bytes=v.params * 2)
    return out


def popular_rows(base_cfg: tc.RunConfig, snapshot, wanted: Callable[[], bool] = lambda: True) -> list[dict]:
    """The popular models with sizes and verdicts (no network: their shapes are shipped). Stops at the next model
    once ``wanted()`` is False (a newer listing was asked for, or the window closed)."""
    rows = []
    with capabilities.one_look():  # one look at the installed packages for the whole listing
        for repo, _arch in catalog.popular():
            if not wanted():
                break
            rows.append(row(repo, base_cfg, snapshot))
    return rows


def search_rows(text: str, base_cfg: tc.RunConfig, snapshot, limit: int = SEARCH_LIMIT,
                wanted: Callable[[], bool] = lambda: True) -> list[dict]:
    """Hub search results; each one's config.json is fetched (a few KB: "config first") so its size and
    verdicts are real. Weights download only when the user asks. Raises HubOffline at once offline. Stops at the
    next result once ``wanted()`` is False."""
    hub.require_online()
    rows = []
    for m in HfApi().list_models(search=text, limit=limit):
        if not wanted():
            break
        try:
            hf_hub_download(m.id, "config.json")
        except Exception as exc:
            rows.append({"repo": m.id, "here": hub.cached_state(m.id), "error": _short(exc)})
            continue
        rows.append(row(m.id, base_cfg, snapshot))
    return rows


def cells(r: dict) -> list[str]:
    """The words of one method column each (full, LoRA, QLoRA): the verdict's, or why there is none."""
    v = r.get("verdict")
    if v is None or not v.methods:
        return [r.get("error", "?")] * len(METHODS)
    return [v.methods[m].words if m in v.methods else "?" for m in METHODS]


def _short(exc: Exception) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:120]
