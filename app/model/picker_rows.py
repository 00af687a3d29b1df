"""The model picker's rows (no Qt; off the GUI thread): popular open models and hub search results,
each with its parameter count, download size, the fit verdict per method on this machine (the same
function the Model and Plan pages ask) and whether it is on this computer."""
from __future__ import annotations

from huggingface_hub import HfApi, hf_hub_download

from app.model import hub
from app.model.planning import METHODS, fit_verdicts
from trainer import config as tc
from trainer.models.spec import load_model_spec

# Popular open models. Each one's shape is shipped (trainer/resources/models/, found by its hub id), so
# its size and verdicts are known before anything downloads.
POPULAR = (
    "HuggingFaceTB/SmolLM-135M", "Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.2-1B", "Qwen/Qwen2.5-1.5B",
    "stabilityai/stablelm-2-1_6b", "google/gemma-2-2b", "microsoft/phi-2", "meta-llama/Llama-3.2-3B",
    "mistralai/Mistral-7B-v0.1", "Qwen/Qwen2.5-7B", "meta-llama/Llama-3.1-8B",
)
SEARCH_LIMIT = 15


def model_config(base_cfg: tc.RunConfig, source: str) -> tc.RunConfig:
    """``base_cfg`` with ``source`` as the model (a hub id, folder or cached id): what the Model page
    sets when this model is picked, so the picker's verdicts are the Model page's."""
    return tc.replace(base_cfg, **{"model.source": source, "model.architecture": None, "model.tokenizer": None})


def row(repo: str, base_cfg: tc.RunConfig, snapshot) -> dict:
    """{'repo', 'params', 'bytes' (bf16 download), 'here', method: verdict} for one hub model."""
    spec = load_model_spec(repo)
    return {"repo": repo, "params": spec.params, "bytes": spec.params * 2, "here": hub.cached_state(repo),
            **fit_verdicts(model_config(base_cfg, repo), snapshot)}


def popular_rows(base_cfg: tc.RunConfig, snapshot) -> list[dict]:
    """The popular models with sizes and verdicts (no network: their shapes are shipped)."""
    rows = []
    for repo in POPULAR:
        try:
            rows.append(row(repo, base_cfg, snapshot))
        except Exception as exc:  # an unreadable shipped file: the row says why instead of vanishing
            rows.append({"repo": repo, "here": hub.cached_state(repo), "error": _short(exc)})
    return rows


def search_rows(text: str, base_cfg: tc.RunConfig, snapshot, limit: int = SEARCH_LIMIT) -> list[dict]:
    """Hub search results; each one's config.json is fetched (a few KB: "config first") so its size and
    verdicts are real. Weights download only when the user asks. Raises HubOffline at once offline."""
    hub.require_online()
    rows = []
    for m in HfApi().list_models(search=text, limit=limit):
        try:
            hf_hub_download(m.id, "config.json")
            rows.append(row(m.id, base_cfg, snapshot))
        except Exception as exc:
            rows.append({"repo": m.id, "here": hub.cached_state(m.id), "error": _short(exc)})
    return rows


def _short(exc: Exception) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:120]


__all__ = ["METHODS", "POPULAR", "popular_rows", "row", "search_rows"]
