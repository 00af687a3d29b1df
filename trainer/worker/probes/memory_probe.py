"""Measure what the estimator predicts, with real torch (worker-side: imports torch inside).

* ``saved_activation_bytes``: bytes autograd saves in one forward + loss, counted as unique
  storages through ``torch.autograd.graph.saved_tensors_hooks`` (parameters excluded).
* ``python -m trainer.worker.probes.memory_probe CONFIG --micro-batch N --out FILE``: two or three real optimizer
  steps of a run config on the GPU (model built from its architecture with random weights, random
  token batches), writing the measured peak (``torch.cuda.max_memory_reserved``) as JSON. Used by
  ``trainpilot-cli plan --measure``. Needs CUDA: exits 2 with a clear message without it.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

from trainer import config as config_mod
from trainer.config.placements import hf_optim
from trainer.config.resolved import resolve_precision
from trainer.core.errors import EXIT_BAD_INPUT, EXIT_OOM
from trainer.launch.argv import single_process_env
from trainer.models.spec import find_config

TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def build_model(source: str, dtype: str = "bf16", attn: str = "sdpa", overrides: dict | None = None):
    """A causal LM with random weights from a config.json (path, folder or shipped name)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = find_config(source)
    if path is None:
        raise FileNotFoundError(f"no config.json for '{source}'")
    d = json.loads(path.read_text(encoding="utf-8"))
    d = {k: v for k, v in d.items() if not k.startswith("_")}
    d.update(overrides or {})
    cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, TORCH_DTYPES[dtype]), attn_implementation=attn)


@contextlib.contextmanager
def saved_storages(*models):
    """Inside the block, record every storage autograd saves for backward that is not a parameter of
    ``models`` (None entries ignored): yields ``{data_ptr: bytes}``, one entry per unique storage."""
    import torch

    params = {p.untyped_storage().data_ptr() for m in models if m is not None for p in m.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params and st.nbytes():
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield seen


def offload_layer_residue(model, batch: int, seq: int, autocast: str | None = None) -> dict:
    """What TRL's activation offload (``trl.models.activation_offloading``, its own code) does with the tensors the
    decoder layers save in one forward with the loss, run on the CPU as if the CPU were the GPU (pinned memory off;
    every decision — size threshold, parameters, a storage saved twice kept on the device, the forward stash — is
    TRL's): ``offloaded`` (bytes copied to the host) and ``kept`` (bytes that stay on the device until backward),
    unique storages, parameters excluded; ``layers`` the decoder layers seen."""
    import contextlib
    from unittest import mock

    import torch
    from trl.models import activation_offloading as ao

    with mock.patch.object(torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("cpu")):
        ctx = ao.get_act_offloading_ctx_manager(model, use_pin_memory=False, warn_if_no_head=False)
    ctx.s1 = torch.cpu.current_stream()  # the CPU has one stream: copies are synchronous
    layers = _decoder_layers(model)
    span = {}
    first = layers[0].register_forward_pre_hook(lambda *a: span.setdefault("first", ctx.tensor_id + 1) and None)
    last = layers[-1].register_forward_hook(lambda *a: span.__setitem__("last", ctx.tensor_id))
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (batch, seq))
    amp = torch.autocast("cpu", dtype=getattr(torch, TORCH_DTYPES[autocast])) if autocast else contextlib.nullcontext()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept, offloaded = {}, {}
    with amp:
        torch.autograd.graph.saved_tensors_hooks.__enter__(ctx)  # TRL's pack hook, without its CUDA-only exit
        try:
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        finally:
            torch.autograd.graph.saved_tensors_hooks.__exit__(ctx, None, None, None)
    for tid, (tensor, moved, *_rest) in ctx.tracker.items():
        storage = tensor.untyped_storage()
        if span["first"] <= tid <= span["last"] and storage.data_ptr() not in params:
            (offloaded if moved else kept)[storage.data_ptr()] = storage.nbytes()
    first.remove()
    last.remove()
    del loss
    return {"kept": int(sum(kept.values())), "offloaded": int(sum(offloaded.values())), "layers": len(layers)}


def _decoder_layers(model):
    """The decoder layers of a causal LM (PEFT-wrapped or not)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner = getattr(base, "model", None) or getattr(base, "transformer", None)
    return getattr(inner, "layers", None) or getattr(inner, "h")


def saved_activation_bytes(model, batch: int, seq: int, checkpointing: bool = False, device: str = "cpu",
                           autocast: str | None = None) -> int:
    """Bytes of the unique non-parameter storages autograd saves for backward in one forward with
    the loss (the tensors a training step holds at its peak, before backward frees them).
    ``autocast`` ("bf16"/"fp16") runs the forward under torch.autocast, as HF's Trainer does."""
    import contextlib

    import torch

    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(0, model.config.get_text_config().vocab_size, (batch, seq), device=device)
    amp = (torch.autocast(device, dtype=getattr(torch, TORCH_DTYPES[autocast])) if autocast
           else contextlib.nullcontext())
    with saved_storages(model) as seen, amp:
        out = model(input_ids=ids, labels=ids, use_cache=False)
    out.loss.backward()
    model.zero_grad(set_to_none=True)
    return int(sum(seen.values()))


def deepspeed_engine(model, micro_batch: int, stage: int, offload_optimizer: bool, offload_params: bool,
                     accumulation: int = 1):
    """A single-process DeepSpeed engine (bf16, AdamW) around ``model``, as the worker would build.
    Without offload it uses torch's AdamW (no CUDA op build needed); with offload DeepSpeed's CPU Adam."""
    import deepspeed


    single_process_env()
    deepspeed.init_distributed()
    h = model.config.hidden_size
    zero = {"stage": stage, "overlap_comm": False, "reduce_bucket_size": h * h,
            "stage3_prefetch_bucket_size": int(0.9 * h * h), "stage3_param_persistence_threshold": 10 * h}
    if offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    cfg = {"train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": accumulation, "bf16": {"enabled": True},
           "zero_optimization": zero,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "torch_adam": not offload_optimizer}}}
    engine, *_ = deepspeed.initialize(model=model, config=cfg,
                                      model_parameters=[p for p in model.parameters() if p.requires_grad])
    return engine


def measure_steps(cfg, micro_batch: int, steps: int = 3) -> dict:
    """Run ``steps`` real optimizer steps of ``cfg`` at ``micro_batch`` on CUDA (two micro-batches
    each when the plan accumulates); peak bytes."""
    import torch

    source = cfg.model.architecture or cfg.model.source
    precision = cfg.speed.precision
    ds = cfg.deepspeed
    # Random init on the GPU takes seconds (a minute per billion parameters on the CPU); DeepSpeed
    # starts from host memory as the worker does, so its model is built there.
    with torch.device("cpu" if ds.enabled is True else "cuda"):
        model = build_model(source, "fp32" if precision == "fp16" else precision, cfg.model.attn_implementation)
    # With accumulation the gradients are held while the next micro-batch runs forward: measure so.
    eff = cfg.training.effective_batch_size
    accum = 1 if isinstance(eff, int) and micro_batch * cfg.world_size >= eff else 2
    from trainer.worker.kernels import chunked_loss, tiled_mlp
    from trainer.worker.kernels.offloaded_checkpoint import offload_context

    if cfg.speed.tiled_mlp is True:  # the run's kernels, as the worker installs them
        tiled_mlp.install(model)
    if cfg.speed.gradient_checkpointing is True:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.method.type != "full":
        from peft import get_peft_model

        from trainer.worker.loading import modeling

        if cfg.speed.gradient_checkpointing is True:
            model.enable_input_require_grads()
        # the run's adapters: its targets (MoE experts, a multimodal model's text layers) and modules to save
        model = get_peft_model(model, modeling.lora_config(cfg, model))
    chunked_loss.install_kernel(model, cfg, "cuda", apply_liger=True)  # the run's loss, as the worker installs it
    offload = contextlib.nullcontext()
    if cfg.speed.activation_offload is True:
        offload = offload_context(model, cfg.speed.gradient_checkpointing is True)
    torch.cuda.reset_peak_memory_stats()
    if ds.enabled is True:
        engine = deepspeed_engine(model, micro_batch, ds.zero_stage, ds.offload_optimizer, ds.offload_params, accum)
        forward, backward, update = engine, engine.backward, engine.step
    else:
        model.to("cuda")
        opt = optimizer_as_trained(cfg, model)
        forward, backward = model, (lambda loss: (loss / accum).backward())
        pending = [0]

        def update():  # the optimizer steps once per ``accum`` micro-batches, as the Trainer's does
            pending[0] += 1
            if pending[0] == accum:
                opt.step()
                opt.zero_grad(set_to_none=True)
                pending[0] = 0
    seq, vocab = cfg.data.seq_len, model.config.vocab_size
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        for _ in range(accum):
            ids = torch.randint(0, vocab, (micro_batch, seq), device="cuda")
            with offload:
                backward(forward(input_ids=ids, labels=ids, use_cache=False).loss)
            update()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return {"micro_batch": micro_batch, "steps": steps, "accumulation": accum, "peak_reserved_bytes": int(torch.cuda.max_memory_reserved()),
            "peak_allocated_bytes": int(torch.cuda.max_memory_allocated()), "step_seconds": times,
            "device": torch.cuda.get_device_name(0)}


def optimizer_as_trained(cfg, model, use_cuda: bool = True):
    """The run's optimizer as HF's ``Trainer.create_optimizer`` builds it for the worker: the ``optim`` the worker's
    TrainingArguments name (``placements.hf_optim``), its two groups (decayed, not), and under 8-bit AdamW every
    ``nn.Embedding`` registered for 32-bit states; with ``training.optimizer_in_backward`` the worker's ``InBackwardStep``
    over it (one optimizer per parameter, stepped from backward; the overrides dropped, 8-bit throughout)."""
    import tempfile
    from types import SimpleNamespace

    from transformers import Trainer, TrainingArguments

    t = cfg.training
    with tempfile.TemporaryDirectory(prefix="trainpilot-measure-") as out:
        args = TrainingArguments(output_dir=out, optim=hf_optim(t.optimizer, bool(cfg.speed.fused_adamw), use_cuda),
                                 learning_rate=t.learning_rate, weight_decay=t.weight_decay, report_to=[],
                                 use_cpu=not use_cuda)
    # create_optimizer reads only these of the Trainer: the model, the arguments, the optimizer not yet built
    holder = SimpleNamespace(model=model, args=args, optimizer=None, optimizer_cls_and_kwargs=None,
                             get_decay_parameter_names=lambda m: Trainer.get_decay_parameter_names(None, m),
                             get_optimizer_cls_and_kwargs=Trainer.get_optimizer_cls_and_kwargs)
    opt = Trainer.create_optimizer(holder)
    if t.optimizer_in_backward is True:
        from trainer.worker.loading.in_backward_step import InBackwardStep

        return InBackwardStep(opt)
    return opt


def main(argv: list[str] | None = None) -> int:
    """Child-process entry: measure one micro-batch; exit 3 on OOM, 2 without CUDA."""
    ap = argparse.ArgumentParser(prog="python -m trainer.worker.probes.memory_probe")
    ap.add_argument("config")
    ap.add_argument("--micro-batch", type=int, required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--set", action="append", default=[])
    args = ap.parse_args(argv)
    import torch


    if not torch.cuda.is_available():
        print("measuring needs an NVIDIA GPU with a CUDA build of torch; this machine has none", file=sys.stderr)
        return EXIT_BAD_INPUT
    cfg = config_mod.load(args.config, args.set)
    if cfg.speed.precision == "auto":  # a hand-written config: resolve as the planner would for this GPU
        cc = ".".join(map(str, torch.cuda.get_device_capability(0)))
        cfg = config_mod.replace(cfg, **{"speed.precision": resolve_precision("auto", "cuda", cc)})
    try:
        result = measure_steps(cfg, args.micro_batch, args.steps)
    except torch.cuda.OutOfMemoryError:
        result = {"micro_batch": args.micro_batch, "oom": True,
                  "peak_reserved_bytes": int(torch.cuda.max_memory_reserved())}
        Path(args.out).write_text(json.dumps(result))
        return EXIT_OOM
    Path(args.out).write_text(json.dumps(result))
    return 0



def saved_objective_bytes(trainer, inputs: dict) -> int:
    """Bytes of the unique non-parameter storages autograd saves in one ``trainer.compute_loss`` (the
    objective's own loss: DPO's policy forward on chosen + rejected, its reference forward, the loss),
    parameters of the policy and of any reference model excluded. CPU or the model's device."""

    model = trainer.model
    model.train()
    ref = getattr(trainer, "ref_model", None)
    with saved_storages(model, ref) as seen:
        loss = trainer.compute_loss(model, inputs)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return int(sum(seen.values()))


def model_state_bytes(trainer) -> dict:
    """Bytes held between steps after one real optimizer step: ``weights`` (every parameter of the
    policy, frozen or not), ``gradients`` (one per trainable parameter, in its dtype), ``optimizer_states``
    (AdamW's tensors), ``reference`` (a separate reference model's parameters; 0 without one)."""
    model = trainer.model
    ref = getattr(trainer, "ref_model", None)

    def unique(params):
        return sum({p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in params}.values())

    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    every = getattr(opt, "optimizer_dict", {}).values() or [opt]  # the fused step: one optimizer per parameter
    states = sum(t.untyped_storage().nbytes() for o in every for s in o.state.values() for t in s.values()
                 if hasattr(t, "untyped_storage") and t.dim() > 0)
    return {"weights": unique(model.parameters()), "gradients": sum(p.numel() * p.element_size() for p in trainable),
            "optimizer_states": states, "reference": unique(ref.parameters()) if ref is not None else 0}


if __name__ == "__main__":
    raise SystemExit(main())
