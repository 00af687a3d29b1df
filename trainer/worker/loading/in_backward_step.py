"""The optimizer step fused into the backward pass (``training.optimizer_in_backward: true``).

Each trainable parameter gets its own optimizer of the run's class (PyTorch's AdamW, or bitsandbytes' paged / 8-bit
AdamW), stepped from ``Tensor.register_post_accumulate_grad_hook`` the moment the parameter's gradient is complete, and
the gradient is freed right after: no full set of gradients ever exists (PyTorch's tutorial "How to save memory by
fusing the optimizer step into the backward pass"; torchtune's ``optimizer_in_bwd``). With one micro-batch per step
(``cross_checks``) it is the same update, element for element, as the separate step of the same optimizer.

HF's Trainer drives it through transformers' own scaffolding for per-parameter optimizers: the optimizer it holds is a
``LayerWiseDummyOptimizer`` (its ``step`` and ``zero_grad`` do nothing; ``optimizer_dict`` holds the per-parameter
optimizers), as for ``galore_*_layerwise``. Two things differ from transformers' layer-wise optimizers, on purpose:

- one learning-rate schedule: HF's ``get_scheduler`` gives each parameter its own scheduler, stepped from a hook (a
  parameter without a gradient in a step falls behind) and never saved (a resume restarts every one at step 0). Here
  the schedule is the run's usual one, built on ``layout`` (the optimizer HF's ``create_optimizer`` made, with its two
  groups: decayed and not; it never steps), and each hook reads its group's current rate;
- checkpoints: ``state_dict`` is exactly the separate optimizer's (``optimizer.pt``: the same groups, the parameters
  numbered in the same order, each one's state), and ``load_state_dict`` reads it back. So a stopped run resumes
  exactly, and a checkpoint of the separate step (the OOM ladder's run before its fused-step rung) resumes into the
  fused one through HF's own loader, and back.

What it cannot do: clip by the global gradient norm (the run has ``max_grad_norm: 0``). The gradient norm is still
measured, from each gradient as its hook sees it: the step events' ``grad_norm`` is the norm of the whole step's
gradient, as a separate step reports it.
Heavy imports: only the worker imports this module.
"""
from __future__ import annotations

import inspect

import torch
from transformers.trainer_pt_utils import LayerWiseDummyOptimizer

from trainer.planning.optimizer_memory import NORM_CHUNK


class InBackwardStep(LayerWiseDummyOptimizer):
    """The Trainer's optimizer when the step runs in backward: one optimizer per parameter, stepped by hooks."""

    def __init__(self, layout: torch.optim.Optimizer):
        self.layout = layout  # HF's optimizer over the same groups: the schedule's target and the checkpoint format
        self.params = [p for group in layout.param_groups for p in group["params"]]
        self._group = {p: i for i, group in enumerate(layout.param_groups) for p in group["params"]}
        inner = {p: _one(layout, group, p) for group in layout.param_groups for p in group["params"]}
        with torch.random.fork_rng(devices=[]):  # the scaffolding draws a dummy tensor: keep the run's random stream
            super().__init__(optimizer_dict=inner, lr=layout.defaults["lr"])
        self._squares = None  # Σ ‖gradient‖² of this step so far (fp32, on the gradients' device)
        _drop_overrides(layout, self.params)
        self._hooks = [p.register_post_accumulate_grad_hook(self._step_one) for p in self.params]

    @torch.no_grad()
    def _step_one(self, param: torch.Tensor) -> None:
        """The parameter's gradient is complete: measure it, step its optimizer at the schedule's rate, free it."""
        if param.grad is None:
            return
        square = squared_norm(param.grad)
        self._squares = square if self._squares is None else self._squares + square.to(self._squares.device)
        inner = self.optimizer_dict[param]
        inner.param_groups[0]["lr"] = self.layout.param_groups[self._group[param]]["lr"]
        inner.step()
        param.grad = None

    def unhooked(self) -> list[torch.Tensor]:
        """The parameters whose post-accumulate-grad hooks lack this step's (none, when it is wired as built)."""
        return [p for p in self.params if not any(getattr(h, "__self__", None) is self and
                                                   getattr(h, "__func__", None) is InBackwardStep._step_one
                                                   for h in (p._post_accumulate_grad_hooks or {}).values())]

    def take_grad_norm(self) -> torch.Tensor | None:
        """The L2 norm of this step's whole gradient (a 0-d tensor; None before any gradient), and start the next."""
        squares, self._squares = self._squares, None
        return None if squares is None else squares.sqrt()

    def state_dict(self) -> dict:
        """The separate optimizer's ``state_dict``: ``layout``'s groups (with the schedule's rate) and every
        parameter's state under its index in those groups."""
        out = self.layout.state_dict()
        state = {}
        for index, param in enumerate(self.params):
            own = self.optimizer_dict[param].state_dict()["state"]
            if 0 in own:
                state[index] = own[0]
        out["state"] = state
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        """Read a ``state_dict`` of this or of the separate optimizer (same class, same model and method)."""
        self.layout.load_state_dict({"state": {}, "param_groups": state_dict["param_groups"]})  # checks the sizes
        saved = state_dict["state"]
        for index, param in enumerate(self.params):
            group = {k: v for k, v in state_dict["param_groups"][self._group[param]].items() if k != "params"}
            own = {0: saved[index]} if index in saved else {}
            self.optimizer_dict[param].load_state_dict({"state": own, "param_groups": [{**group, "params": [0]}]})



def _one(layout: torch.optim.Optimizer, group: dict, param: torch.Tensor) -> torch.optim.Optimizer:
    """An optimizer of ``layout``'s class and settings for ``param`` alone, with its group's hyperparameters."""
    cls = type(layout)
    accepted = inspect.signature(cls.__init__).parameters
    kwargs = {k: v for k, v in layout.defaults.items() if k in accepted}
    for attr in ("args", "is_paged"):  # bitsandbytes keeps these beside its defaults (args: bits, min_8bit_size)
        if attr in accepted and hasattr(layout, attr):
            kwargs[attr] = getattr(layout, attr)
    return cls([{**{k: v for k, v in group.items() if k != "params"}, "params": [param]}], **kwargs)


def of(optimizer) -> InBackwardStep | None:
    """The ``InBackwardStep`` behind the Trainer's optimizer (accelerate wraps it), or None for a separate step."""
    inner = getattr(optimizer, "optimizer", optimizer)
    return inner if isinstance(inner, InBackwardStep) else None


def squared_norm(grad: torch.Tensor) -> torch.Tensor:
    """‖grad‖² in fp32, ``NORM_CHUNK`` elements at a time: ``vector_norm(dtype=float32)`` copies what it measures into
    fp32, and whole that copy was 4 bytes per element of the gradient (2.0 GiB for an 8B model's
    embedding; the planner counts one chunk's copy)."""
    flat = grad.reshape(-1)
    if flat.numel() <= NORM_CHUNK:
        return torch.linalg.vector_norm(flat, dtype=torch.float32).square()
    return sum(torch.linalg.vector_norm(c, dtype=torch.float32).square() for c in flat.split(NORM_CHUNK))


def _drop_overrides(layout: torch.optim.Optimizer, params: list) -> None:
    """HF registers each ``nn.Embedding`` for 32-bit states on bitsandbytes' global manager before an 8-bit
    optimizer; the manager keys what it finds by the parameter's (group, index) in its optimizer, which is (0, 0) for
    every per-parameter optimizer here, so the embedding's override would reach every optimizer initialised after it.
    The fused step drops the overrides of this model's parameters: its 8-bit states are 8-bit throughout, as in
    torchtune's recipe (the plan says so: approximate either way)."""
    manager = getattr(layout, "mng", None)  # bitsandbytes' optimizers hold the global manager; PyTorch's do not
    if manager is None:
        return
    ours = {id(p) for p in params}
    manager.module_weight_config_triple = [t for t in manager.module_weight_config_triple
                                           if id(getattr(t[0], t[1])) not in ours]
