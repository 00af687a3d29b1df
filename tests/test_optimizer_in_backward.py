"""The optimizer step fused into backward (``training.optimizer_in_backward``, trainer/worker/loading/in_backward_step.py).

The same update as the separate step: per parameter, on a small model, for PyTorch's AdamW and bitsandbytes' 32-bit
and 8-bit AdamW (bitsandbytes' CPU backend runs them here; paged ones fall back to plain buffers on the CPU), and
through ``trainpilot-cli run`` on the demo model and two real families. Checkpoints: the separate step's format,
so a stopped fused run resumes exactly and a separate step's checkpoint resumes into the fused one (the OOM ladder's
fused-step rung). bitsandbytes' fp32 AdamW against PyTorch's: within fp32 rounding.
"""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import yaml
from helpers_train import cli, events, final_weights, losses, needs_deepspeed, tiny_config, write_config

from trainer import config as C

# One micro-batch per step, no clipping: what the fused step needs (cross_checks), on both sides of a comparison.
ONE_MICRO_BATCH = {"effective_batch_size": 4, "micro_batch_size": 4, "gradient_accumulation_steps": 1,
                   "max_grad_norm": 0.0, "weight_decay": 0.1}


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(50, 96), torch.nn.Linear(96, 96), torch.nn.LayerNorm(96),
                               torch.nn.Linear(96, 50))


def _groups(model) -> list[dict]:
    """HF's grouping: decayed weights, then the rest (biases, norms)."""
    named = list(model.named_parameters())
    decay = [p for n, p in named if n.endswith("weight") and not n.startswith("2.")]
    return [{"params": decay, "weight_decay": 0.1}, {"params": [p for _, p in named if not any(p is d for d in decay)],
                                                      "weight_decay": 0.0}]


def _train(model, optimizer, steps: int, fused: bool) -> None:
    g = torch.Generator().manual_seed(3)
    for _ in range(steps):
        ids = torch.randint(0, 50, (4, 12), generator=g)
        loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.roll(1, 1).flatten())
        loss.backward()
        if not fused:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def _optimizers():
    import bitsandbytes as bnb
    return {"torch": torch.optim.AdamW, "bnb32": bnb.optim.AdamW32bit, "bnb8": bnb.optim.AdamW8bit,
            "paged8": bnb.optim.PagedAdamW8bit}


@pytest.mark.parametrize("kind", ["torch", "bnb32", "bnb8", "paged8"])
def test_the_fused_step_is_the_separate_steps_update_and_checkpoint(kind):
    from trainer.worker.loading.in_backward_step import InBackwardStep

    cls = _optimizers()[kind]
    warnings.filterwarnings("ignore", "Paged optimizers are not supported on CPU")
    plain, fused = _model(), _model()
    separate = cls(_groups(plain), lr=1e-2)
    step = InBackwardStep(cls(_groups(fused), lr=1e-2))
    _train(plain, separate, 5, fused=False)
    _train(fused, step, 5, fused=True)
    for a, b in zip(plain.parameters(), fused.parameters()):
        assert torch.equal(a, b), "the same optimizer, the same gradient: the same update, bit for bit"
        assert b.grad is None, "each gradient is freed once its parameter is updated"
    mine, theirs = step.state_dict(), separate.state_dict()
    assert mine["param_groups"] == theirs["param_groups"]
    assert mine["state"].keys() == theirs["state"].keys()
    for index, state in theirs["state"].items():
        assert _flat(mine["state"][index]).keys() == _flat(state).keys()
        assert all(torch.equal(torch.as_tensor(_flat(mine["state"][index])[k]), torch.as_tensor(v))
                   for k, v in _flat(state).items())
    again = _model(1)  # another model's weights, then the separate step's checkpoint: continues as the separate does
    again.load_state_dict(plain.state_dict())
    resumed = InBackwardStep(cls(_groups(again), lr=1e-2))
    resumed.load_state_dict(copy.deepcopy(separate.state_dict()))  # as torch.load gives it: not the live tensors
    _train(plain, separate, 2, fused=False)
    _train(again, resumed, 2, fused=True)
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), again.parameters()))


def _flat(state: dict) -> dict:
    return {**{k: v for k, v in state.items() if not isinstance(v, dict)},
            **{k: v for inner in state.values() if isinstance(inner, dict) for k, v in inner.items()}}


def rounding_bound(a: torch.Tensor, b: torch.Tensor, lr: float, steps: range, betas=(0.9, 0.999)) -> torch.Tensor:
    """How far bitsandbytes' fp32 AdamW may drift from PyTorch's over ``steps`` (the step counts t), per element.
    The arithmetic is the same, rounded differently: bitsandbytes folds the bias corrections into the step size
    (lr·√(1-β2^t)/(1-β1^t), ε·√(1-β2^t)) and computes 1-β^t in fp32, where PyTorch divides the moments by corrections
    computed in double. Per step: one unit in the last place of the weight (the final add), plus the update (at most
    about lr) times the rounding of 1-β^t in fp32, which the cancellation amplifies early in a run (ε/(1-β2^t): 1.2e-4
    at t=1, 2.4e-5 at t=5, 2e-7 by t=1000), plus a few ε of the update's own operations."""
    eps = torch.finfo(torch.float32).eps
    ulp = eps * torch.maximum(a.abs(), b.abs()).detach()
    update = sum(lr * (eps / (1 - betas[1] ** t) + eps / (1 - betas[0] ** t) + 8 * eps) for t in steps)
    return len(steps) * ulp + update


def test_bitsandbytes_fp32_adamw_gives_torch_adamw_update_within_fp32_rounding():
    """PagedAdamW32bit's arithmetic (bitsandbytes' 32-bit AdamW kernel; on the CPU without paging) against
    torch.optim.AdamW: within ``rounding_bound``. Measured here: 2.4e-7 after 10 steps at lr 1e-2 on N(0,1) weights."""
    import bitsandbytes as bnb

    steps, lr = 10, 1e-2
    torch.manual_seed(0)
    start = [torch.randn(300, 70), torch.randn(5000)]
    a = [p.clone().requires_grad_() for p in start]
    b = [p.clone().requires_grad_() for p in start]
    ours, theirs = torch.optim.AdamW(a, lr=lr, weight_decay=0.1), bnb.optim.AdamW32bit(b, lr=lr, weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for x, y in zip(a, b):
            x.grad = torch.randn(x.shape, generator=g)
            y.grad = x.grad.clone()
        ours.step()
        theirs.step()
    for x, y in zip(a, b):
        bound = rounding_bound(x, y, lr, range(1, steps + 1))
        assert ((x - y).abs() <= bound).all(), float(((x - y).abs() - bound).max())
        assert not torch.equal(x, start[0] if x.shape == start[0].shape else start[1]), "the weights moved"


@pytest.mark.parametrize("changes, fields", [
    ({"training.gradient_accumulation_steps": 4}, ("training.gradient_accumulation_steps", "training.optimizer_in_backward")),
    ({"training.micro_batch_size": 2, "training.gradient_accumulation_steps": "auto"}, ("training.micro_batch_size",)),
    ({"training.max_grad_norm": 1.0}, ("training.max_grad_norm", "max_grad_norm: 0")),
    ({"deepspeed.enabled": True}, ("deepspeed.enabled", "deepspeed.enabled: false")),
    ({"distributed.num_gpus": 2, "training.effective_batch_size": 32}, ("distributed.num_gpus", "one GPU")),
])
def test_what_the_fused_step_cannot_do_is_refused_with_the_fix(changes, fields):
    data = tiny_config(training={**ONE_MICRO_BATCH, "effective_batch_size": 16, "micro_batch_size": 16,
                                 "optimizer_in_backward": True})
    C.validate(data)  # the good config passes
    for key, value in changes.items():
        section, name = key.split(".")
        data.setdefault(section, {})[name] = value
    with pytest.raises(C.ConfigError) as err:
        C.validate(data)
    text = err.value.render()
    assert all(f in text for f in fields), text
    assert "optimizer_in_backward: false" in text  # the other way out: the separate step


def test_bitsandbytes_optimizers_are_refused_on_the_cpu():
    with pytest.raises(C.ConfigError, match="training.optimizer.*on the CPU use adamw"):
        C.validate(tiny_config(training={"optimizer": "paged_adamw_32bit"}))


# ---------------------------------------------------------------------------------------------
# Through trainpilot-cli run
# ---------------------------------------------------------------------------------------------
def _run(tmp_path, name: str, fused: bool, steps: int = 5, env: dict | None = None, **sections):
    cfg = tiny_config(training={**ONE_MICRO_BATCH, "max_steps": steps, "optimizer_in_backward": fused},
                      checkpoints={"every_steps": 100}, **sections)
    run = tmp_path / name
    proc = cli("run", write_config(tmp_path / f"{name}.yaml", cfg), "--run-dir", run, "--quiet", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run


def _step_ran(run) -> dict:
    """run_started's ``optimizer_step`` of the run's last attempt: what the worker built (its optimizer's class, the
    fused step's hooks), so a fused step silently turned off fails the comparisons below."""
    return events(run, "run_started")[-1]["optimizer_step"]


def _same_run(plain, fused) -> None:
    """Equal weights after every step (the Finished event's fingerprint, final/), equal losses, and the gradient norm
    the fused step measured from its hooks equals the separate step's (a different summation order: 1e-5); the
    fused run's worker really stepped in backward, the plain one after it."""
    assert _step_ran(plain) == {"step": "separate", "states": "adamw", "paged": False, "optimizer": "torch.AdamW"}
    assert _step_ran(fused) == {"step": "fused", "states": "adamw", "paged": False, "optimizer": "torch.AdamW"}
    a, b = events(plain, "step"), events(fused, "step")
    assert [e["loss"] for e in a] == [e["loss"] for e in b]
    for x, y in zip(a, b):
        assert y["grad_norm"] == pytest.approx(x["grad_norm"], rel=1e-5)
    wa, wb = final_weights(plain), final_weights(fused)
    assert all(torch.equal(wa[n], wb[n]) for n in wa)
    assert events(plain, "finished")[-1]["weights_sha256"] == events(fused, "finished")[-1]["weights_sha256"]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["demo", "qwen2.5", "llama-3.1"])
def test_fused_step_trains_the_same_weights_as_the_separate_step(tmp_path, family):
    """After 5 optimizer steps (fp32 on the CPU, the same kernels per element): bit-identical weights. Qwen2.5 and
    Llama 3.1 untie their embeddings (two large matrices stepped at opposite ends of backward), the demo model is
    Llama-shaped; both real families with their real tokenizers on the bundled data, Llama 3.1 with gradient
    checkpointing (each layer's forward recomputed in backward, after later layers' weights were already updated)."""
    sections = {}
    if family != "demo":
        import real_models as rm

        sections = {"model": {"source": str(rm.family_dir(family))}}
    if family == "llama-3.1":
        sections["speed"] = {"precision": "fp32", "gradient_checkpointing": True}
    plain = _run(tmp_path, "plain", False, **sections)
    fused = _run(tmp_path, "fused", True, **sections)
    _same_run(plain, fused)
    started = events(fused, "run_started")[-1]
    assert started["engine_change"] is None


@pytest.mark.slow
@pytest.mark.user_start  # stop and resume: the worker starts exactly as a user's (plugins/zygote.py)
def test_a_stopped_fused_run_resumes_exactly(tmp_path):
    full = _run(tmp_path, "full", True, steps=8)
    part = _run(tmp_path, "part", True, steps=8, env={"TRAINPILOT_INJECT_STOP": "3"})
    assert events(part, "stopped")[-1]["step"] == 3
    proc = cli("resume", part, "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _step_ran(full)["step"] == _step_ran(part)["step"] == "fused"
    assert losses(part) == losses(full)
    wa, wb = final_weights(full), final_weights(part)
    assert all(torch.equal(wa[n], wb[n]) for n in wa)


@pytest.mark.slow
def test_a_separate_steps_checkpoint_resumes_into_the_fused_step(tmp_path):
    """The OOM ladder's fused-step rung: a run of the separate step stops (its checkpoint: AdamW's moments per
    parameter, the schedule), its config turns the fused step on, and it resumes: every later step is the one the
    separate run takes (moments restarted from zero would change the next loss)."""
    full = _run(tmp_path, "full", False, steps=8)
    part = _run(tmp_path, "part", False, steps=8, env={"TRAINPILOT_INJECT_STOP": "3"})
    config = part / "config.yaml"
    data = yaml.safe_load(config.read_text())
    data["training"]["optimizer_in_backward"] = True
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = cli("resume", part, "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    started = events(part, "run_started")[-1]
    assert started["resume_from"].endswith("checkpoint-3") and started["engine_change"] is None
    assert [e["optimizer_step"]["step"] for e in events(part, "run_started")] == ["separate", "fused"]
    assert losses(part) == losses(full)
    wa, wb = final_weights(full), final_weights(part)
    assert all(torch.equal(wa[n], wb[n]) for n in wa)


@pytest.mark.slow
@pytest.mark.deepspeed
@needs_deepspeed
def test_a_deepspeed_checkpoint_resumes_into_the_fused_step(tmp_path):
    """A checkpoint of another engine (DeepSpeed ZeRO-2, its own format) resumes into the fused step: engine_switch
    writes each parameter's AdamW moments into that parameter's own optimizer. The losses after the resume are the
    uninterrupted separate run's (DeepSpeed's and PyTorch's AdamW agree to 1e-5 here, test_deepspeed)."""
    full = _run(tmp_path, "full", False, steps=6)
    part = _run(tmp_path, "part", False, steps=6, env={"TRAINPILOT_INJECT_STOP": "3"},
                deepspeed={"enabled": True, "zero_stage": 2})
    config = part / "config.yaml"
    data = yaml.safe_load(config.read_text())
    data["deepspeed"]["enabled"], data["training"]["optimizer_in_backward"] = False, True
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = cli("resume", part, "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    change = events(part, "run_started")[-1]["engine_change"]
    assert [e["optimizer_step"]["step"] for e in events(part, "run_started")] == ["separate", "fused"]
    assert events(part, "run_started")[0]["optimizer_step"]["states"] == "deepspeed"
    assert change["from"] == "DeepSpeed ZeRO-2 (AdamW)" and change["to"] == "plain PyTorch (AdamW)"
    assert "AdamW moments and step count (per parameter)" in change["carried"] and not change["not_carried"]
    a, b = losses(full), losses(part)
    assert sorted(b) == list(range(1, 7))
    for step in a:
        assert b[step] == pytest.approx(a[step], abs=1e-5), step


@pytest.mark.slow
def test_fused_step_under_dpo_with_lora_is_the_separate_steps_update(tmp_path):
    """TRL's DPO trainer (a TrainPilotMixin trainer too) training LoRA adapters: only the adapters have hooks, the
    frozen base none; the trained weights' fingerprint (every trainable tensor) equals the separate step's."""
    from helpers_pref import pref_config

    runs = {}
    for fused in (False, True):
        cfg = pref_config(tmp_path, training={**ONE_MICRO_BATCH, "max_steps": 4, "optimizer_in_backward": fused})
        run = tmp_path / f"dpo-{fused}"
        proc = cli("run", write_config(tmp_path / f"dpo-{fused}.yaml", cfg), "--run-dir", run, "--quiet")
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[fused] = run
    plain, fused = runs[False], runs[True]
    assert (_step_ran(plain)["step"], _step_ran(fused)["step"]) == ("separate", "fused")
    assert [e["loss"] for e in events(plain, "step")] == [e["loss"] for e in events(fused, "step")]
    assert events(plain, "finished")[-1]["weights_sha256"] == events(fused, "finished")[-1]["weights_sha256"]
    assert all(e["grad_norm"] is not None for e in events(fused, "step"))


def _trainer(tmp_path, optim: str, fused: bool, weights: dict | None = None):
    """HF's Trainer (ours) over a small Llama on the CPU, its optimizer built as a run builds it."""
    from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

    from trainer.worker.train.hf_glue import TrainPilotTrainer

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=96))
    if weights is not None:
        model.load_state_dict(weights)
    args = TrainingArguments(output_dir=str(tmp_path / optim), optim=optim, use_cpu=True, report_to=[],
                             learning_rate=1e-2, weight_decay=0.1)
    trainer = TrainPilotTrainer(model=model, args=args)
    trainer.tp_optimizer_in_backward = fused
    trainer.create_optimizer()
    return trainer


def _steps(trainer, count: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(count):
        ids = torch.randint(0, 96, (2, 16), generator=g)
        trainer.model(input_ids=ids, labels=ids).loss.backward()
        trainer.optimizer.step()  # the fused step's does nothing: its hooks stepped during backward
        trainer.model.zero_grad(set_to_none=True)


def test_adamw_moments_carry_into_bitsandbytes_fp32_states_of_the_fused_step(tmp_path):
    """engine_switch across state formats: a PyTorch AdamW checkpoint (exp_avg, exp_avg_sq) resumed on
    paged_adamw_32bit with the fused step (bitsandbytes' names for the same fp32 moments: state1, state2, one
    optimizer per parameter): the next steps are PyTorch's within fp32 rounding (moments restarted from zero would
    move the weights by ~lr); and that run's checkpoint reads back as the same moments."""
    from trainer.worker.train import engine_switch

    lr = 1e-2
    torch_run = _trainer(tmp_path, "adamw_torch", False)
    _steps(torch_run, 3, seed=1)
    checkpoint = tmp_path / "checkpoint-3"
    checkpoint.mkdir()
    torch.save(torch_run.optimizer.state_dict(), checkpoint / "optimizer.pt")
    paged = _trainer(tmp_path, "paged_adamw_32bit", True, weights=torch_run.model.state_dict())
    engine_switch._write_torch(paged, *engine_switch._torch_states(checkpoint, paged)[:2])
    _steps(torch_run, 2, seed=2)
    _steps(paged, 2, seed=2)
    for (name, a), b in zip(torch_run.model.named_parameters(), paged.model.parameters()):
        bound = rounding_bound(a, b, lr, range(4, 6))  # steps 4 and 5 from the same moments
        assert ((a - b).abs() <= bound).all(), (name, float((a - b).abs().max()))
    again = tmp_path / "checkpoint-5"
    again.mkdir()
    torch.save(paged.optimizer.state_dict(), again / "optimizer.pt")
    read, step, _ = engine_switch._torch_states(again, torch_run)
    assert step == 5 and set(read) == {n for n, p in paged.model.named_parameters() if p.requires_grad}
    for name, moments in read.items():
        own = paged.optimizer.optimizer_dict[dict(paged.model.named_parameters())[name]].state
        state = next(iter(own.values()))
        assert torch.equal(moments["exp_avg"], state["state1"]) and torch.equal(moments["exp_avg_sq"], state["state2"])


def test_the_fused_step_measures_a_large_gradient_in_chunks(monkeypatch):
    """The hook's gradient norm is taken NORM_CHUNK elements at a time (its fp32 copy is one chunk, which is what the
    planner counts), and it is the whole gradient's norm."""
    from trainer.worker.loading import in_backward_step

    grad = torch.randn(10_000, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    whole = torch.linalg.vector_norm(grad, dtype=torch.float32).square()
    monkeypatch.setattr(in_backward_step, "NORM_CHUNK", 1_000)
    chunked = in_backward_step.squared_norm(grad)
    assert chunked.dtype == torch.float32 and torch.allclose(chunked, whole, rtol=1e-5)  # fp32 sums, reordered


def test_the_fused_steps_8bit_states_are_8bit_for_the_embeddings_too():
    """HF registers each nn.Embedding for 32-bit states on bitsandbytes' global manager; under the fused step that
    override is dropped (torchtune's recipe, and what the planner counts): bitsandbytes keys what it finds by the
    parameter's (group, index), (0, 0) in every per-parameter optimizer, so it would not stay with the embedding."""
    import bitsandbytes as bnb

    from trainer.worker.loading.in_backward_step import InBackwardStep

    manager = bnb.optim.GlobalOptimManager.get_instance()
    saved = (list(manager.module_weight_config_triple), dict(manager.pid2config), dict(manager.index2config))
    try:
        model = _model()
        manager.register_module_override(model[0], "weight", {"optim_bits": 32})  # as HF's create_optimizer does
        step = InBackwardStep(bnb.optim.AdamW8bit(_groups(model), lr=1e-2))
        _train(model, step, 2, fused=True)
        widths = {name: step.optimizer_dict[p].state[p]["state1"].dtype for name, p in model.named_parameters()
                  if p.numel() >= 4096}
        assert widths == {"0.weight": torch.uint8, "1.weight": torch.uint8, "3.weight": torch.uint8}
    finally:
        manager.module_weight_config_triple, manager.pid2config, manager.index2config = saved


@pytest.mark.parametrize("optim,states", [("adamw_torch", "adamw"), ("adamw_bnb_8bit", "adamw_8bit"),
                                          ("paged_adamw_8bit", "paged_adamw_8bit"),
                                          ("paged_adamw_32bit", "paged_adamw_32bit")])
def test_run_started_says_the_step_and_states_that_were_built(tmp_path, optim, states):
    """``_tp_optimizer_step`` (run_started's ``optimizer_step``) reads the optimizer HF built and the fused step's hooks:
    a fused step with a parameter whose hook is gone is a fault, not a run that says "fused" and never updates it."""
    for fused in (False, True):
        trainer = _trainer(tmp_path, optim, fused)
        said = trainer._tp_optimizer_step()
        assert said == {"step": "fused" if fused else "separate", "states": states, "paged": "paged" in optim,
                        "optimizer": "torch.AdamW" if optim == "adamw_torch" else "bitsandbytes.AdamW"}
    trainer.optimizer._hooks[3].remove()
    with pytest.raises(RuntimeError, match="no hook on 1 trained parameter"):
        trainer._tp_optimizer_step()
