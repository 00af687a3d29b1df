"""Fixtures that stand in for what this CPU-only machine is not (every test may ask for them)."""
from __future__ import annotations

import sys
import types

import pytest


@pytest.fixture
def cuda_torch(monkeypatch):
    """This machine as a GPU recording describes it: PyTorch built for CUDA beside the replayed GPU. Stands in
    ``torch.version`` the way ``trainer.core.capabilities`` reads an imported torch (the development machine has a
    CPU-only build; without this, Review rightly blocks every replayed-GPU plan on the device, and the planner's
    tests judge a replayed GPU too)."""
    monkeypatch.setitem(sys.modules, "torch.version",
                        types.SimpleNamespace(__version__="2.13.0+cu128", cuda="12.8", hip=None))
