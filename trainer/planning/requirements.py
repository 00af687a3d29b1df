"""What a config needs of this machine beyond memory: an NVIDIA GPU, bitsandbytes, flash-attn,
DeepSpeed, the trackers it reports to, a hostfile. One rule set, asked by preflight (Start refuses what is unmet), the wizard's
Review (through preflight) and the fit verdict ("needs bitsandbytes"). Packages are answered by
``trainer.core.capabilities``. Also the other side: which optional libraries a run never uses
(``unused_packages``), so that its processes do not spend seconds importing them. Light: no torch.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from trainer.config import hostfile
from trainer.config.placements import DEFAULT, placement
from trainer.config.resolved import ResolvedRunConfig
from trainer.core import capabilities
from trainer.core.errors import UserError
from trainer.models.spec import find_config, spec_for_run
from trainer.planning import gpus, loss_kernel


@dataclass(frozen=True)
class Requirement:
    """One unmet requirement: the config ``field`` that asks for it, what is missing in a few words
    (``needs``: "an NVIDIA GPU", "bitsandbytes"…) and the full message with the fix."""

    field: str
    needs: str
    message: str
    every_method: bool = False  # the same for full, LoRA and QLoRA (this PyTorch): Start refuses it, no fit verdict says it


def unmet(cfg, hardware=None) -> list[Requirement]:
    """Every requirement of ``cfg`` (resolved or not) this machine does not meet; ``hardware`` is a
    MachineSnapshot (None: the GPU is not judged)."""
    caps = capabilities.probe(hardware)
    bnb = caps.packages["bitsandbytes"].install
    out = []
    if cfg.method.type == "qlora" and (cfg.device == "cpu" or caps.cuda_gpu is False):
        out.append(Requirement("method.type", "an NVIDIA GPU", "QLoRA needs an NVIDIA GPU (bitsandbytes 4-bit runs on "
                                                               "CUDA only); use method.type: lora here"))
    elif cfg.method.type == "qlora" and caps.torch.can_use_gpu is False:  # what the Environment page's 4-bit line says
        out.append(Requirement("method.type", "a CUDA build of PyTorch",
                               f"QLoRA's 4-bit weights need an NVIDIA GPU through the CUDA build of PyTorch, and this "
                               f"environment has {caps.torch.words()}; install the CUDA build (python "
                               "installers/torch_build.py prints the pip command), or use method.type: lora"))
    elif cfg.method.type == "qlora" and not caps.has("bitsandbytes"):
        out.append(Requirement("method.type", "bitsandbytes", f"QLoRA needs bitsandbytes, which is not installed; "
                                                              f"{bnb}, or use method.type: lora"))
    states = placement(cfg.training.optimizer)
    if states.package is not None and not caps.has(states.package):
        out.append(Requirement("training.optimizer", states.package,
                               f"{states.name} needs {states.package}, which is not installed; "
                               f"{caps.packages[states.package].install}, or use {DEFAULT}"))
    if cfg.model.attn_implementation == "flash_attention_2" and not caps.has("flash-attn"):
        out.append(Requirement("model.attn_implementation", "flash-attn",
                               "flash_attention_2 needs flash-attn, which is not installed; "
                               f"{caps.packages['flash-attn'].install}, or use sdpa"))
    if cfg.training.objective == "grpo" and cfg.grpo.use_vllm and not caps.has("vllm"):
        out.append(Requirement("grpo.use_vllm", "vLLM", "vLLM is not installed in this environment; "
                               f"{capabilities.OPTIONAL['vllm'].install}, or set grpo.use_vllm: false to sample with "
                               "transformers"))
    if cfg.deepspeed.enabled is True and not caps.has("deepspeed"):
        out.append(Requirement("deepspeed.enabled", "DeepSpeed",
                               "DeepSpeed is not installed; install it (pip install --no-build-isolation deepspeed) "
                               "or set deepspeed.enabled: false (offload then is not available)"))
    for tracker in cfg.output.report_to:
        if tracker in capabilities.OPTIONAL and not caps.has(tracker):
            out.append(Requirement("output.report_to", tracker,
                                   f"{tracker} is not installed in TrainPilot's environment; "
                                   f"{capabilities.OPTIONAL[tracker].install} there, or remove {tracker} from "
                                   "output.report_to"))
    if cfg.device == "cuda" and caps.cuda_gpu is False:
        out.append(Requirement("device", "an NVIDIA GPU",
                               "the config asks for cuda but no NVIDIA GPU was found; set device: cpu or auto"))
    elif cfg.device == "cuda" and caps.torch.can_use_gpu is False:
        out.append(Requirement("device", "a CUDA build of PyTorch", _torch_cannot_use_gpu(caps.torch, hardware, cfg), True))
    kernel_problem = _loss_kernel_problem(cfg, caps)
    if kernel_problem:
        out.append(Requirement("speed.loss_kernel", kernel_problem.needs, kernel_problem.detail))
    cards = gpus.missing(cfg, hardware) if cfg.device != "cpu" and getattr(hardware, "gpus", None) else ""
    if cards:  # a run folder resumed on another machine, a card taken out: the worker would see no GPU
        out.append(Requirement("distributed.gpus", "the listed GPUs", cards, True))
    for problem in hostfile.problems(cfg):  # DeepSpeed's own rules (config.hostfile), said before anything starts
        out.append(Requirement("distributed.hostfile", "a hostfile", problem))
    return out


def _loss_kernel_problem(cfg, caps: capabilities.Capabilities) -> loss_kernel.Problem | None:
    """Why the set ``speed.loss_kernel`` cannot run here (``loss_kernel.problem``); ``auto`` always can."""
    kernel = cfg.speed.loss_kernel
    if kernel in ("auto", loss_kernel.HF):
        return None
    try:
        family = spec_for_run(cfg).family
    except UserError:
        family = None
    device = cfg.device if cfg.device != "auto" else ("cpu" if caps.cuda_gpu is False else "cuda")
    return loss_kernel.problem(kernel, cfg, family, device)


def _torch_cannot_use_gpu(torch, hardware, cfg=None) -> str:
    """The GPU is there (or a recording says so) but this PyTorch cannot use one: what the worker would
    refuse at its first step (``torch.cuda.is_available()`` is False), said before anything starts. It names the
    cards the run trains on (``distributed.gpus``; 'auto': the card the planner plans first), not GPU 0 of a machine
    whose GPU 0 is another card."""
    cards = list(getattr(hardware, "gpus", None) or [])
    listed = cfg.distributed.gpus if cfg is not None else "auto"
    if isinstance(listed, list):
        cards = [g for g in cards if g.uuid in listed or g.index in listed] or cards
    elif len(cards) > 1:
        cards = gpus.ranked(hardware, getattr(cfg, "plan_goal", "fastest"))[:1]
    source = str(getattr(hardware, "source", "") or "")
    names = list(dict.fromkeys(g.name for g in cards))
    gpu = (f"the {names[0]}" if len(cards) == 1 else f"the {len(cards)} GPUs ({', '.join(names)})") if cards else \
        "the GPU"
    if source.startswith("replay:"):
        gpu += f" of the recording {source.removeprefix('replay:')}"
    return (f"training would run on {gpu} (device cuda; device auto picks the GPU whenever one is found), but this "
            f"environment's PyTorch cannot use a GPU ({torch.words()}); set device: cpu to train on this computer's "
            "CPU, or install the CUDA build of PyTorch for this GPU (python installers/torch_build.py prints the pip "
            "command)")


# Optional libraries that transformers, accelerate, PEFT and TRL import whenever they are installed, though most runs
# never call them: DeepSpeed (2-3 s of a process's start), PEFT (which imports bitsandbytes, and bitsandbytes compiles
# its ops with torch.compile at import: together 1-1.5 s of CPU on the 2-core development machine).
LEAN_PACKAGES = ("deepspeed", "bitsandbytes", "peft")


def unused_packages(cfg) -> tuple[str, ...]:
    """Which of ``LEAN_PACKAGES`` a run of ``cfg`` never uses: its worker, export and chat processes leave them
    unimported (``trainer.worker.lean``). ``cfg`` read or resolved: what the planner may still choose (DeepSpeed
    'auto'; 8-bit AdamW when ``plan_allow_approximate``) counts as used until a resolved config says otherwise. A
    model whose own files name a quantization or hold an adapter keeps them all (loading it may need any)."""
    if _model_asks_for_packages(cfg.model.source):
        return ()
    planned = isinstance(cfg, ResolvedRunConfig)
    # bitsandbytes' optimizers (config.placements: paged fp32 too); the planner may still pick 8-bit ones under
    # plan_allow_approximate (supervise.py takes a standby worker only where its set is the resolved run's)
    eight_bit = placement(cfg.training.optimizer).package == "bitsandbytes" or \
        (cfg.plan_allow_approximate and not planned)
    out = []
    if cfg.deepspeed.enabled is False:
        out.append("deepspeed")
    if cfg.method.type != "qlora" and not eight_bit:
        out.append("bitsandbytes")
    if cfg.method.type == "full":
        out.append("peft")
    return tuple(out)


def _model_asks_for_packages(source: str) -> bool:
    """True when the model's folder holds an adapter or its config.json names a quantization (or cannot be read)."""
    path = find_config(source)
    if path is None:
        return False  # a name TrainPilot plans from its own records, or nothing local yet: a plain model
    if (path.parent / "adapter_config.json").is_file():
        return True
    try:
        return "quantization_config" in json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return True
