"""The tiled MLP under real DeepSpeed ZeRO-2 and ZeRO-3 on the CPU (one process, gloo): ZeRO-3 partitions the
weights and gathers them in each module's call, so the tiles' backward must run with them gathered and DeepSpeed
must reduce each gradient once; ZeRO-2 takes the gradients the autograd function returns. Loss and every full
gradient (``safe_get_full_grad``) equal the untiled engine's, full and LoRA. A child process: DeepSpeed's process
group stays out of the test process."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers_train import REPO, needs_deepspeed

pytestmark = [pytest.mark.slow, pytest.mark.deepspeed, needs_deepspeed]

CHILD = r'''
import json, sys
sys.path.insert(0, "tests")
import deepspeed
from deepspeed.utils import safe_get_full_grad
from helpers_kernels import tiny_batch, tiny_model
from trainer.launch.argv import single_process_env
from trainer.worker.kernels import tiled_mlp

seen = []
plain_init = tiled_mlp._Tiling.__init__
tiled_mlp._Tiling.__init__ = lambda self, *a, **k: (seen.append(k.get("zero3")), plain_init(self, *a, **k))[1]


def grads(stage, tiled, lora):
    model = tiny_model("llama", lora=lora)
    if tiled:
        tiled_mlp.install(model)
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
           "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
    engine, *_ = deepspeed.initialize(model=model, config=cfg,
                                      model_parameters=[p for p in model.parameters() if p.requires_grad])
    loss = engine(**tiny_batch("padding")).loss
    engine.backward(loss)
    return loss.item(), {n: safe_get_full_grad(p) for n, p in engine.module.named_parameters() if p.requires_grad}


single_process_env()
deepspeed.init_distributed(dist_backend="gloo")
out = {}
for stage in (2, 3):
    for lora in (False, True):
        seen.clear()
        (l0, g0), (l1, g1) = grads(stage, False, lora), grads(stage, True, lora)
        out[f"{stage}-{lora}"] = {"loss": abs(l0 - l1), "grad": max((g0[k] - g1[k]).abs().max().item() for k in g0),
                                  "params": len(g0), "zero3_tiles": sorted(set(seen))}
print("RESULT " + json.dumps(out))
'''


def test_tiled_gradients_equal_under_zero2_and_zero3(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=900)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    result = json.loads(line[len("RESULT "):])
    for key, r in result.items():
        assert r["loss"] <= 1e-6 and r["grad"] <= 1e-6 and r["params"] > 0, (key, r)
        assert r["zero3_tiles"] == ([True] if key.startswith("3") else [False]), (key, r)
