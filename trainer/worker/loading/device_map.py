"""Worker side: the ``device_map`` of a model whose decoder layers are split over the run's cards in one process
(``distributed.layer_split``; the planner's shares: ``planning/layer_split``, docs/gpus.md).

transformers loads a checkpoint straight onto the cards a ``device_map`` names (each module's weights to its card;
QLoRA's Linears quantised there), and accelerate's hooks move each module's input to its card, so the forward runs
card by card. The map here is the planner's, module by module: the modules before the decoder layers (the
embeddings, the rotary embedding) on the first card, ``distributed.layers_per_gpu`` layers on each card in order,
the modules after them (the final norm) on the last card, and the LM head on the last card — or, with tied
embeddings, on the first beside the embedding it shares. Heavy imports (torch, accelerate) inside functions.
"""
from __future__ import annotations

from trainer.core.errors import UserError


def decoder_layers(model) -> tuple[str, int]:
    """The dotted name of the model's decoder-layer ``ModuleList`` and its length: the longest ModuleList whose
    length is the config's ``num_hidden_layers`` (``model.layers`` in Llama, Qwen, Mistral, Gemma)."""
    import torch

    want = getattr(model.config, "num_hidden_layers", None)
    found = [(name, len(m)) for name, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    exact = [f for f in found if f[1] == want]
    if not exact:
        raise UserError(f"distributed.layer_split: this model has no list of its {want} decoder layers to split "
                        "over the cards; set distributed.layer_split: false", field="distributed.layer_split")
    return exact[0]


def even_counts(layers: int, cards: int) -> list[int]:
    """Equal shares of ``layers`` over ``cards`` (the first cards one more where it does not divide): what a
    resolved config that leaves ``layers_per_gpu`` "auto" splits by."""
    return [layers // cards + (1 if i < layers % cards else 0) for i in range(cards)]


def split_map(model, counts: list[int], devices: list) -> dict:
    """Module name → device for ``counts`` decoder layers per card on ``devices`` (in order). Every parameter and
    buffer of ``model`` is under exactly one named module. UserError where the counts do not add up to the
    model's layers."""
    path, n = decoder_layers(model)
    if sum(counts) != n or len(counts) != len(devices) or min(counts) < 1:
        raise UserError(f"distributed.layers_per_gpu: {counts} for {len(devices)} card(s) does not split this model's "
                        f"{n} decoder layers (one count of 1 or more per card, adding up to {n}); set "
                        "distributed.layers_per_gpu: auto", field="distributed.layers_per_gpu")
    owner = []
    for card, count in enumerate(counts):
        owner += [card] * count
    tied = _tied_head(model)
    out: dict = {}

    def place(module, prefix: str, seen_layers: list) -> None:
        for name, child in module.named_children():
            full = f"{prefix}{name}"
            if full == path:
                for i in range(n):
                    out[f"{full}.{i}"] = devices[owner[i]]
                seen_layers.append(True)
            elif path.startswith(full + "."):
                place(child, full + ".", seen_layers)
            elif _is_head(model, full):
                out[full] = devices[0 if tied else -1]
            else:
                out[full] = devices[-1 if seen_layers else 0]
        for name, _ in module.named_parameters(recurse=False):  # a parameter held by a module above the layers
            out[f"{prefix}{name}"] = devices[0]
        for name, _ in module.named_buffers(recurse=False):
            out[f"{prefix}{name}"] = devices[0]

    place(model, "", [])
    return out


def _is_head(model, name: str) -> bool:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return head is not None and dict(model.named_modules()).get(name) is head


def _tied_head(model) -> bool:
    """The LM head shares the embedding's weight (tied embeddings)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    return head is not None and emb is not None and head.weight is emb.weight


def device_for(device_map: dict, name: str):
    """The device ``device_map`` gives the module ``name``: its own entry or its nearest ancestor's (the first
    card for the model itself and anything the map does not reach)."""
    while name:
        if name in device_map:
            return device_map[name]
        name = name.rpartition(".")[0]
    return device_map.get("", next(iter(device_map.values())))


def planned_map(cfg, model, devices: list) -> dict:
    """The run's map: ``distributed.layers_per_gpu`` (the planner's), else equal shares, over ``devices``."""
    counts = cfg.distributed.layers_per_gpu
    if not isinstance(counts, list):
        counts = even_counts(decoder_layers(model)[1], len(devices))
    return split_map(model, list(counts), devices)


def skeleton(conf, auto, common: dict):
    """The model of ``conf`` on the meta device (no memory), to read its module names from."""
    import torch

    with torch.device("meta"):
        return auto.from_config(conf, **common)


def dispatch(model, device_map: dict):
    """``model`` (built in host memory) moved onto the cards of ``device_map`` with accelerate's hooks moving
    each module's inputs to its card (what ``from_pretrained(device_map=…)`` does for a checkpoint)."""
    from accelerate import dispatch_model

    return dispatch_model(model, device_map=device_map)


def cards_of(cfg) -> list:
    """The devices the layers are split over: ``cuda:0``… in ``distributed.gpus`` order (the worker sees exactly
    the run's cards, ``CUDA_VISIBLE_DEVICES``, so the i-th is ``cuda:i``)."""
    return [f"cuda:{i}" for i in range(cfg.distributed.num_gpus)]
