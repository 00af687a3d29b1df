"""The edge with transformers that can break under a user: ``trainer/worker/train/hf_glue.py`` overrides
methods of HF's Trainer (private ones among them: ``_save_checkpoint``, ``_get_output_dir``, ``_get_grad_norm``,
``_get_train_sampler``). transformers is pinned to the range the suite tests, and these tests fail
loudly, naming the method, when an overridden method's parameters change."""
from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import inspect
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HF_GLUE = REPO / "trainer" / "worker" / "train" / "hf_glue.py"
# The parameters (name, kind, default) of each Trainer method TrainPilotMixin overrides, as in the
# transformers the suite tests (5.23). A new override must be recorded here.
RECORDED = {
    "__init__": None,  # public, and ours passes every argument through (*args, **kwargs)
    "training_step": ("self", "model", "inputs", "num_items_in_batch=None"),
    "prediction_step": ("self", "model", "inputs", "prediction_loss_only", "ignore_keys=None"),
    "_get_output_dir": ("self", "trial"),
    "_save_checkpoint": ("self", "model", "trial"),
    "_get_train_sampler": ("self", "train_dataset=None"),
    # HF's set-up then resume: a checkpoint another engine wrote is restored by engine_switch instead
    "_prepare_for_training": ("self", "max_steps", "train_dataloader", "resume_from_checkpoint"),
    # HF's save, then the files that go with the model (a multimodal checkpoint's processor files)
    "_save": ("self", "output_dir=None", "state_dict=None"),
    # training.optimizer_in_backward (in_backward): HF's optimizer becomes one per parameter, its schedule goes on
    # HF's groups, and the gradient norm is the one the hooks measured
    "create_optimizer": ("self", "model=None"),
    "create_scheduler": ("self", "num_training_steps", "optimizer=None"),
    "_get_grad_norm": ("self", "model", "grad_norm=None"),
    # HF's flop estimate with the parameter count taken once (HF counts every parameter on every micro-batch)
    "floating_point_ops": ("self", "inputs"),
}


def _our_overrides() -> list[str]:
    """Methods TrainPilotMixin defines that do not start with our ``_tp_`` prefix (read from the source)."""
    tree = ast.parse(HF_GLUE.read_text(encoding="utf-8"))
    mixin = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TrainPilotMixin")
    return [f.name for f in mixin.body if isinstance(f, ast.FunctionDef) and not f.name.startswith("_tp_")]


def _params(args: ast.arguments) -> tuple[str, ...]:
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    out = [a.arg + (f"={ast.unparse(d)}" if d is not None else "") for a, d in zip(positional, defaults)]
    out += [f"*{args.vararg.arg}"] if args.vararg else []
    out += [a.arg + (f"={ast.unparse(d)}" if d is not None else "") for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    return tuple(out + ([f"**{args.kwarg.arg}"] if args.kwarg else []))


def _trainer_methods() -> dict[str, tuple[str, ...]]:
    """Parameters of the methods of ``transformers.Trainer``, read from its source (no import: fast)."""
    source = Path(importlib.util.find_spec("transformers").submodule_search_locations[0]) / "trainer.py"
    tree = ast.parse(source.read_text(encoding="utf-8"))
    trainer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    return {f.name: _params(f.args) for f in trainer.body if isinstance(f, ast.FunctionDef)}


def test_every_override_is_recorded():
    new = [m for m in _our_overrides() if m not in RECORDED]
    assert not new, f"hf_glue.TrainPilotMixin overrides {new}: record their Trainer signatures in RECORDED"


@pytest.mark.parametrize("method", [m for m, p in RECORDED.items() if p is not None])
def test_an_overridden_trainer_method_keeps_its_parameters(method):
    methods = _trainer_methods()
    assert method in methods, (f"transformers.Trainer.{method} is gone (transformers "
                               f"{importlib.metadata.version('transformers')}): hf_glue.TrainPilotMixin.{method} "
                               f"overrides it; adapt hf_glue.py before moving the pin in pyproject.toml")
    assert methods[method] == RECORDED[method], (
        f"transformers.Trainer.{method} changed its parameters to {methods[method]} (recorded {RECORDED[method]}) "
        f"in transformers {importlib.metadata.version('transformers')}: hf_glue.TrainPilotMixin.{method} overrides "
        f"it; adapt hf_glue.py, then record the new parameters here")


def test_transformers_is_pinned_to_the_tested_range():
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    pin = re.search(r'"transformers>=([\d.]+),<([\d.]+)"', text)
    assert pin, "pyproject.toml must pin transformers to a range (>=X,<Y) the suite tests"
    low, high = (tuple(int(x) for x in v.split(".")) for v in pin.groups())
    have = tuple(int(x) for x in importlib.metadata.version("transformers").split(".")[:2])
    assert low[:2] <= have < high[:2], f"transformers {have} is outside the pinned range {pin.group(0)}"


@pytest.mark.slow  # imports transformers and TRL (seconds)
def test_the_trl_trainers_we_wrap_accept_our_overrides():
    from transformers import Trainer
    from trl import DPOTrainer, KTOTrainer
    from trl.experimental.orpo import ORPOTrainer

    for cls in (Trainer, DPOTrainer, KTOTrainer, ORPOTrainer):
        for method, recorded in RECORDED.items():
            if recorded is None:
                continue
            params = inspect.signature(getattr(cls, method)).parameters
            if any(p.kind is p.VAR_POSITIONAL for p in params.values()):
                continue  # (*args, **kwargs) passes ours through
            names = tuple(params)
            assert names == tuple(r.split("=")[0] for r in recorded), f"{cls.__name__}.{method}{names}"
