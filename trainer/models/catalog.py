"""Which real model on the Hugging Face hub each shipped architecture (``trainer/resources/models/``)
describes: the one table behind hub id → architecture (planning a hub model before it downloads), the
picker's popular models, and the planner's "a smaller model" alternatives (real models only, of the
same kind: causal for causal, encoder-decoder for encoder-decoder). Light: a table, no I/O.
"""
from __future__ import annotations

# shipped architecture name → the hub model whose published config.json it holds, smallest first per kind.
CAUSAL = {
    "smollm-135m": "HuggingFaceTB/SmolLM-135M",
    "gpt2": "openai-community/gpt2",
    "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B",
    "qwen3-0.6b": "Qwen/Qwen3-0.6B",
    "lfm2-700m": "LiquidAI/LFM2-700M",
    "qwen3.5-0.8b": "Qwen/Qwen3.5-0.8B",
    "gemma-3-1b": "google/gemma-3-1b-pt",
    "llama-3.2-1b": "meta-llama/Llama-3.2-1B",
    "qwen2.5-1.5b": "Qwen/Qwen2.5-1.5B",
    "stablelm-2-1.6b": "stabilityai/stablelm-2-1_6b",
    "qwen3-1.7b": "Qwen/Qwen3-1.7B",
    "granite-3.3-2b": "ibm-granite/granite-3.3-2b-instruct",
    "gemma-2-2b": "google/gemma-2-2b",
    "phi-2": "microsoft/phi-2",
    "smollm3-3b": "HuggingFaceTB/SmolLM3-3B",
    "llama-3.2-3b": "meta-llama/Llama-3.2-3B",
    "phi-3-mini": "microsoft/Phi-3-mini-4k-instruct",
    "qwen2.5-vl-3b": "Qwen/Qwen2.5-VL-3B-Instruct",
    "phi-4-mini": "microsoft/Phi-4-mini-instruct",
    "qwen3-4b": "Qwen/Qwen3-4B",
    "gemma-3-4b": "google/gemma-3-4b-it",
    "mistral-7b": "mistralai/Mistral-7B-v0.1",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B",
    "command-r7b": "CohereForAI/c4ai-command-r7b-12-2024",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B",
    "qwen2.5-vl-7b": "Qwen/Qwen2.5-VL-7B-Instruct",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "olmo-2-13b": "allenai/OLMo-2-1124-13B",
    "gpt-oss-20b": "openai/gpt-oss-20b",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "qwen2.5-32b": "Qwen/Qwen2.5-32B",
}
ENCODER_DECODER = {
    "flan-t5-small": "google/flan-t5-small",
    "flan-t5-base": "google/flan-t5-base",
    "flan-t5-large": "google/flan-t5-large",
    "flan-t5-xl": "google/flan-t5-xl",
}
# Shipped architectures that describe no published model: random-weight test and demo shapes.
TEST_ARCHITECTURES = {"tiny-llama": "demo-tiny-llama", "tiny-t5": None}
# The popular models the picker lists (causal LMs people fine-tune, 2024–26), in its order (by size).
POPULAR = ("smollm-135m", "qwen2.5-0.5b", "qwen3-0.6b", "qwen3.5-0.8b", "gemma-3-1b", "llama-3.2-1b", "qwen2.5-1.5b",
           "stablelm-2-1.6b", "qwen3-1.7b", "granite-3.3-2b", "gemma-2-2b", "phi-2", "smollm3-3b", "llama-3.2-3b",
           "qwen2.5-vl-3b", "phi-4-mini", "qwen3-4b", "gemma-3-4b", "mistral-7b", "qwen2.5-7b", "llama-3.1-8b",
           "qwen2.5-vl-7b", "qwen3-8b",
           "gpt-oss-20b", "qwen3-30b-a3b", "qwen2.5-32b")

HUB_IDS = {**CAUSAL, **ENCODER_DECODER}


def hub_id(architecture: str) -> str | None:
    """The hub model a shipped architecture describes, or None (a test architecture, or not shipped)."""
    return HUB_IDS.get(architecture)


def architecture_of(source: str) -> str | None:
    """The shipped architecture for a hub id (case-insensitive) or the demo model's name, or None."""
    key = source.strip().lower()
    for arch, repo in HUB_IDS.items():
        if repo.lower() == key:
            return arch
    return next((arch for arch, alias in TEST_ARCHITECTURES.items() if alias == key), None)


def real_models(encoder_decoder: bool) -> list[tuple[str, str]]:
    """``(architecture, hub id)`` of every shipped real model of one kind (never a test architecture)."""
    return list((ENCODER_DECODER if encoder_decoder else CAUSAL).items())


def popular() -> list[tuple[str, str]]:
    """``(hub id, architecture)`` of the picker's popular models."""
    return [(CAUSAL[a], a) for a in POPULAR]
