"""What the vision tower saves for backward per picture, measured with autograd (part of the structure probe).

The text layers are measured on fake tensors (``saved_bytes``); vision towers compute their patch positions, windows
and tiles from the picture's grid with data-dependent operations (Qwen's ``repeat_interleave`` over ``grid_thw``,
Idefics3's per-tile patch counts) that fake tensors cannot run. So the tower is measured on real CPU tensors, at its
real widths but trimmed to its first two blocks (the first, and one typical block), with random weights: one
``get_image_features`` forward — the model's own code — per point, under ``saved_tensors_hooks`` (distinct storages,
parameters skipped), attributed to the first block, the typical block, a per-layer merger (Qwen3-VL's deepstack) and
the rest (patch and position embeddings, the post-norm, the projector). Attention is the fused-kernel stand-in the
text layers use (``saved_bytes``: q, k, v, the output and an fp32 log-sum-exp, never s² probabilities).

A unit is what the tower runs at once: a picture (Qwen, Gemma 3, LLaVA) or a tile (Idefics3/SmolVLM). Qwen's pictures at 8×8, 16×16 and 24×24 patches and two 8×8 pictures, which separate
``bytes = shared + units · (c + l·n + q·n²)`` for n positions per unit; fixed-size units (Gemma 3, LLaVA, Idefics3's
tiles) at their one size, once (what a batch shares is then counted per unit: 37 kB for Gemma 3's tower).

Setups (which parts train): ``frozen`` (nothing: the default), ``projector`` (the projector's weights),
``tower`` (the tower and the projector), ``tower_lora`` (a frozen tower whose every block Linear's output requires
grad, as a LoRA adapter's would, and the projector). Imports torch inside functions: worker side only.
"""
from __future__ import annotations

import time

from trainer.worker.probes import saved_bytes

VISION_WORDS = ("vision", "visual", "image")
SETUPS = ("frozen", "projector", "tower", "tower_lora")
QWEN_GRIDS = ((1, 8), (1, 16), (1, 24), (2, 8))  # (pictures, patches per side)
FIXED_UNITS = ((1, 0),)  # one unit: what a batch shares is a few kB here (measured: 37 kB for Gemma 3)


def is_projector(name: str) -> bool:
    """Whether a module name (its last part) names the projector between the vision tower and the language model:
    the worker's rule (``model_parts.PROJECTOR_NAMES``), so the probe measures what ``method.train_vision`` trains."""
    from trainer.worker.loading.model_parts import PROJECTOR_NAMES

    return name.rsplit(".", 1)[-1] in PROJECTOR_NAMES


def parts(model, towers: list[dict]) -> dict | None:
    """{"tower": [names], "projector": [names]} of a model's vision side (from the structure record's towers), or
    None when it has no vision tower. The projector: the towers named like one, and such children inside the
    vision tower (Qwen's ``visual.merger``, Qwen3-VL's ``deepstack_merger_list``)."""
    tower = [t["name"] for t in towers if not is_projector(t["name"]) and
             any(w in t["name"].lower() for w in VISION_WORDS)]
    if not tower:
        return None
    projector = [t["name"] for t in towers if is_projector(t["name"])]
    for root in tower:
        projector += [f"{root}.{n}" for n, _ in model.get_submodule(root).named_children() if is_projector(n)]
    return {"tower": tower, "projector": projector}


def _params(model, names: list[str]) -> int:
    return sum(p.numel() for n in names for p in model.get_submodule(n).parameters())


def block_list(tower):
    """The tower's list of transformer blocks: its longest ModuleList (ties: the one holding more parameters; a
    per-layer merger list, Qwen3-VL's deepstack, is shorter)."""
    import torch

    lists = [m for m in tower.modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    return max(lists, key=lambda l: (len(l), sum(p.numel() for p in l.parameters())))


def linears(module) -> list:
    """[relative name, in, out, has bias] of every nn.Linear in ``module``."""
    import torch

    return [[n, m.in_features, m.out_features, m.bias is not None] for n, m in module.named_modules()
            if isinstance(m, torch.nn.Linear)]


def describe(model, towers: list[dict]) -> dict | None:
    """The record's ``vision`` section without measurements: tower and projector names and parameters, the tower's
    depth and width, one block's Linears and the projector's (LoRA on the tower, or a trained projector)."""
    found = parts(model, towers)
    if found is None:
        return None
    tower = model.get_submodule(found["tower"][0])
    blocks = block_list(tower)
    proj_ids = {id(p) for n in found["projector"] for p in model.get_submodule(n).parameters()}
    tower_params = sum(p.numel() for n in found["tower"] for p in model.get_submodule(n).parameters()
                       if id(p) not in proj_ids)
    hidden = next((getattr(tower.config, k) for k in ("hidden_size", "embed_dim") if getattr(tower.config, k, None)), 0)
    return {**found, "tower_params": tower_params, "projector_params": _params(model, found["projector"]),
            "depth": len(blocks), "hidden": int(hidden), "block_linears": linears(blocks[-1]),
            "projector_linears": [[f"{n}.{x[0]}" if x[0] else n, *x[1:]] for n in found["projector"]
                                  for x in linears(model.get_submodule(n))],
            "taps": len(getattr(tower, "deepstack_visual_indexes", None) or [])}


# -- inputs ------------------------------------------------------------------------------------------------------
def unit_kind(model_type: str) -> str:
    """'dynamic' (Qwen: any grid of patches), 'tiles' (Idefics3/SmolVLM) or 'fixed' (one picture size)."""
    if model_type.startswith("qwen"):
        return "dynamic"
    return "tiles" if model_type in ("idefics3", "smolvlm") else "fixed"


def inputs(model, units: int, side: int) -> tuple[dict, int]:
    """(get_image_features keyword arguments, positions per unit) for ``units`` pictures (tiles) of ``side`` patches
    per side (dynamic) or the tower's one size."""
    import torch

    vc = model.config.vision_config
    kind, dtype = unit_kind(model.config.model_type), torch.bfloat16
    if kind == "dynamic":
        p, t = vc.patch_size, getattr(vc, "temporal_patch_size", 2)
        grid = torch.tensor([[1, side, side]] * units)
        return {"pixel_values": torch.randn(units * side * side, 3 * t * p * p, dtype=dtype), "image_grid_thw": grid}, \
            side * side
    s = vc.image_size
    n = (s // vc.patch_size) ** 2
    if kind == "tiles":
        return {"pixel_values": torch.randn(1, units, 3, s, s, dtype=dtype),
                "pixel_attention_mask": torch.ones(1, units, s, s, dtype=torch.bool)}, n
    return {"pixel_values": torch.randn(units, 3, s, s, dtype=dtype)}, n


# -- the measurement ---------------------------------------------------------------------------------------------
def prepare(model, found: dict):
    """Trim the tower to its first two blocks (and one deepstack tap, after the second), materialise the tower and the
    projector on the CPU with random weights (in place). Returns (kept blocks, tap modules)."""
    import torch

    tower = model.get_submodule(found["tower"][0])
    blocks = block_list(tower)
    kept = torch.nn.ModuleList(list(blocks)[:2])
    for parent in tower.modules():
        for name, child in list(parent.named_children()):
            if child is blocks:
                setattr(parent, name, kept)
    taps = []
    if getattr(tower, "deepstack_visual_indexes", None):
        tower.deepstack_visual_indexes = [len(kept) - 1]
        taps = list(tower.deepstack_merger_list)[:1]
    for name in found["tower"] + found["projector"]:
        module = model.get_submodule(name)
        if any(p.device.type == "meta" for p in module.parameters()):
            module.to_empty(device="cpu")
            _initialise(model, module)
    return kept, taps


def _initialise(model, module) -> None:
    """Weights and buffers (position ids, rotary frequencies) as the model's own initialisation sets them."""
    from transformers import PreTrainedModel

    owners = [m for m in module.modules() if isinstance(m, PreTrainedModel)]
    if not isinstance(module, PreTrainedModel):
        module.apply(model._init_weights)
    for owner in owners:
        owner.apply(owner._init_weights)


def _trainable(model, found: dict, setup: str) -> None:
    for p in model.parameters():
        p.requires_grad_(False)
    names = found["projector"] + (found["tower"] if setup == "tower" else [])
    if setup != "frozen":
        for n in names:
            for p in model.get_submodule(n).parameters():
                p.requires_grad_(p.device.type != "meta")


def tower_adapters(blocks, on: bool):
    """Every block Linear's output requiring grad (LoRA on the tower: ``saved_bytes.adapter_outputs``), or none."""
    import torch

    return saved_bytes.adapter_outputs(m for b in blocks for m in b.modules() if isinstance(m, torch.nn.Linear) and on)


def saved(model, blocks, taps, kwargs: dict, skip: set) -> dict:
    """Bytes of distinct non-parameter storages one picture forward saves, by part."""
    import torch

    params = {p.untyped_storage()._cdata for p in model.parameters() if p.device.type != "meta"} | skip
    seen: dict = {}
    marks = [(b, "first" if i == 0 else "layer", "rest") for i, b in enumerate(blocks)]
    marks += [(t, "tap", "rest") for t in taps]
    with saved_bytes.attribution("rest", marks) as where:
        def pack(t):
            st = t.untyped_storage()
            if st._cdata not in params and st._cdata not in seen and st.nbytes():
                seen[st._cdata] = (where[0], st.nbytes(), st)  # the storage kept alive: no id reused
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model.model.get_image_features(**kwargs)
    out: dict = {}
    for part, n, _ in seen.values():
        out[part] = out.get(part, 0) + n
    return out


PARTS = ("first", "layer", "tap", "rest")


def fit(points: list[tuple[int, int, dict]]) -> dict:
    """Per part [c, l, q] (bytes per unit = c + l·n + q·n², n positions per unit) and ``shared`` (bytes once per
    forward), from (units, positions, bytes by part) points: three one-unit sizes and two units of the first size, or
    (fixed size) one unit, whose bytes are then all per unit."""
    if len(points) == 1:
        (_, _, one), = points
        return {"shared": 0.0, **{p: [float(one.get(p, 0)), 0.0, 0.0] for p in PARTS}}
    (_, n1, a), (_, n2, b), (_, n3, c), (_, _, d) = points
    out, shared = {}, 0.0
    for part in PARTS:
        y1, y2, y3 = a.get(part, 0), b.get(part, 0), c.get(part, 0)
        per1 = d.get(part, 0) - y1  # one more unit of n1 positions
        s = y1 - per1
        shared += s
        q = ((y3 - y1) / (n3 - n1) - (y2 - y1) / (n2 - n1)) / (n3 - n2)
        lin = (y2 - y1) / (n2 - n1) - q * (n1 + n2)
        out[part] = [round(per1 - lin * n1 - q * n1 * n1, 2), round(lin, 4), round(q, 8)]
    return {"shared": round(shared, 2), **out}


def measure(model, found: dict) -> dict:
    """``{"unit", "positions", "setups": {setup: fit}, "points", "seconds"}`` (the model is changed in place: call it
    on a model of its own)."""
    started = time.perf_counter()
    blocks, taps = prepare(model, found)
    kind = unit_kind(model.config.model_type)
    grid = QWEN_GRIDS if kind == "dynamic" else FIXED_UNITS
    setups = {}
    with saved_bytes.flash_everywhere():
        for setup in SETUPS:
            _trainable(model, found, setup)
            with tower_adapters(blocks, setup == "tower_lora") as ids:
                points = []
                for units, side in grid:
                    kwargs, n = inputs(model, units, side)
                    points.append((units, n, saved(model, blocks, taps, kwargs, set(ids))))
            setups[setup] = fit(points)
    positions = None if kind == "dynamic" else points[0][1]
    return {"unit": "tile" if kind == "tiles" else "picture", "positions": positions, "setups": setups,
            "points": [[u, n] for u, n, _ in points], "seconds": round(time.perf_counter() - started, 1)}
