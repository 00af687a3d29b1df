"""One capabilities probe (trainer/core/capabilities.py) answers "is X installed" for the doctor, preflight,
the wizard's Review (``preflight.start_problems``), the planner and the OOM ladder; Review's problems are
the ones Start refuses, in the same words."""
from __future__ import annotations

import importlib.util
import sys

import pytest

from helpers_train import DELETE, REPO, run_cli, write_workspace_config, write_demo_data
from trainer import config as tc
from trainer.core import capabilities
from trainer.hardware.source import open_probe
from trainer.planning import ladder
from trainer.supervisor import doctor, preflight

LAPTOP = REPO / "tests" / "fixtures" / "hardware" / "rtx4090_laptop_16gb.jsonl"
NO_GPU = REPO / "tests" / "fixtures" / "hardware" / "no_gpu.jsonl"
# "bitsandbytes is not installed" whatever this machine has: a None entry in sys.modules hides a package.
CUDA_TORCH = "import sys, types; sys.modules['torch.version'] = types.SimpleNamespace(__version__='2.13.0+cu128', " \
             "cuda='12.8', hip=None); "  # the cuda_torch fixture's stand-in, in a child
HIDE = "import sys; sys.modules['bitsandbytes'] = None; sys.argv[0] = 'trainpilot-cli'; " \
       "from trainer.cli.main import main; sys.exit(main(sys.argv[1:]))"


def _laptop(path=LAPTOP):
    probe = open_probe(str(path))
    try:
        return probe.snapshot()
    finally:
        probe.close()


def test_installed_is_find_spec_and_a_hidden_package_reads_missing(monkeypatch):
    for name, opt in capabilities.OPTIONAL.items():
        found = all(importlib.util.find_spec(m) is not None for m in (opt.module, *opt.requires))
        assert capabilities.installed(name) is found, name
    assert capabilities.OPTIONAL["liger-kernel"].requires == ("triton",)  # Liger's kernels are Triton programs
    monkeypatch.setitem(sys.modules, "deepspeed", None)
    caps = capabilities.probe(_laptop())
    assert not caps.has("deepspeed") and caps.cuda_gpu is True
    assert caps.packages["deepspeed"].version is None and "pip install" in caps.packages["deepspeed"].install
    assert capabilities.probe(None).cuda_gpu is None


def test_the_doctor_says_what_the_probe_says(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", None)
    monkeypatch.setitem(sys.modules, "deepspeed", None)
    checks = {c["name"]: c for c in doctor.light_checks("runs", _laptop())}
    assert not checks["flash-attn"]["ok"] and "flash-attn" in checks["flash-attn"]["fix"]
    assert not checks["deepspeed"]["ok"] and "pip install" in checks["deepspeed"]["fix"]
    for name in capabilities.OPTIONAL:
        if name not in ("flash-attn", "deepspeed", *doctor.TORCH_SIDE):
            assert checks[name]["ok"] is capabilities.installed(name), name
    assert not set(doctor.TORCH_SIDE) & set(checks)  # the torch-side child's loss kernel, 4-bit and 8-bit lines


def test_the_ladder_stops_before_deepspeed_when_it_is_missing(monkeypatch, tmp_path):
    write_demo_data(tmp_path / "train.jsonl", 20)
    cfg = tc.load(write_workspace_config(tmp_path, {"speed.gradient_checkpointing": True, "speed.loss_kernel": "chunked",
                                          "deepspeed.enabled": DELETE}))  # DeepSpeed left to the ladder
    monkeypatch.setitem(sys.modules, "deepspeed", None)
    assert ladder.next_step(cfg) is None
    monkeypatch.delitem(sys.modules, "deepspeed")
    if capabilities.installed("deepspeed"):
        assert ladder.next_step(cfg).changes["deepspeed.offload_optimizer"] is True


def test_review_blocks_qlora_without_bitsandbytes_as_start_refuses_it(monkeypatch, tmp_path, cuda_torch):
    write_demo_data(tmp_path / "train.jsonl", 20)
    path = write_workspace_config(tmp_path, {"device": "auto", "method.type": "qlora", "speed.precision": "auto", "deepspeed.enabled": "auto",
                                   "output.runs_dir": str(tmp_path / "runs")})
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    ready = preflight.start_problems(tc.load(path), _laptop(), run_dir=tmp_path / "runs" / "r")
    assert not ready.ready and ready.plan is not None
    (field, message), = [p for p in ready.problems if p[0] == "method.type"]
    assert "bitsandbytes" in message and "pip install bitsandbytes" in message
    start = run_cli(["run", str(path), "--hardware", str(LAPTOP), "--run-dir", str(tmp_path / "runs" / "r")],
                    cwd=tmp_path, python_code=CUDA_TORCH + HIDE)  # the child too: the laptop's CUDA build
    assert start.returncode == 2 and f"{field}: {message}" in start.stderr
    assert "Traceback" not in start.stderr and not (tmp_path / "runs").exists()


def test_review_blocks_a_run_folder_start_cannot_create(tmp_path):
    write_demo_data(tmp_path / "train.jsonl", 20)
    (tmp_path / "afile").write_text("mine\n")
    path = write_workspace_config(tmp_path)
    ready = preflight.start_problems(tc.load(path), _laptop(NO_GPU), run_dir=tmp_path / "afile" / "run")
    (field, message), = ready.problems
    assert field == "output.runs_dir" and "afile" in message and "choose a folder" in message
    start = run_cli(["run", str(path), "--hardware", str(NO_GPU), "--run-dir", str(tmp_path / "afile" / "run")],
                    cwd=tmp_path)
    assert start.returncode == 2 and message in start.stderr


def test_review_of_a_good_config_is_ready_and_creates_nothing(tmp_path):
    write_demo_data(tmp_path / "train.jsonl", 20)
    ready = preflight.start_problems(tc.load(write_workspace_config(tmp_path)), _laptop(NO_GPU))
    assert ready.ready, ready.problems
    assert ready.run_dir.parent == tmp_path / "runs" and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("changes, field, package", [
    ({"training.optimizer": "adamw_8bit"}, "training.optimizer", "bitsandbytes"),
    ({"model.attn_implementation": "flash_attention_2"}, "model.attn_implementation", "flash-attn"),
])
def test_machine_problems_name_the_field_and_the_install(monkeypatch, tmp_path, changes, field, package):
    write_demo_data(tmp_path / "train.jsonl", 20)
    monkeypatch.setitem(sys.modules, capabilities.OPTIONAL[package].module, None)
    cfg = tc.load(write_workspace_config(tmp_path, {**changes, "device": "auto"}))
    problems = dict(preflight.machine_problems(cfg, _laptop()))
    assert package in problems[field] and "pip install" in problems[field]


def test_a_tracker_that_is_not_installed_is_refused_before_start(monkeypatch, tmp_path):
    write_demo_data(tmp_path / "train.jsonl", 20)
    monkeypatch.setitem(sys.modules, "wandb", None)
    cfg = tc.load(write_workspace_config(tmp_path, {"output.report_to": ["wandb"]}))
    problems = dict(preflight.machine_problems(cfg, _laptop(NO_GPU)))
    assert "wandb is not installed" in problems["output.report_to"]
    assert "pip install wandb" in problems["output.report_to"]
    checks = {c["name"]: c for c in doctor.light_checks("runs", _laptop(NO_GPU))}
    assert not checks["wandb"]["ok"] and checks["mlflow"]["ok"] is capabilities.installed("mlflow")


def _torch_code(cuda: str | None) -> str:
    """A CLI child whose PyTorch is the build named (``cuda`` None: CPU-only), whatever this machine has."""
    return ("import sys, types; sys.modules['torch.version'] = types.SimpleNamespace(__version__='2.13.0', "
            f"cuda={cuda!r}, hip=None); sys.argv[0] = 'trainpilot-cli'; "
            "from trainer.cli.main import main; sys.exit(main(sys.argv[1:]))")


def _stand_in_torch(monkeypatch, cuda: str | None) -> None:
    import types

    monkeypatch.setitem(sys.modules, "torch.version", types.SimpleNamespace(__version__="2.13.0", cuda=cuda, hip=None))


@pytest.mark.slow  # a child process
def test_the_torch_build_is_read_without_importing_torch():
    import importlib.metadata
    import subprocess

    build = capabilities.torch_build()
    assert build.found and build.version == importlib.metadata.version("torch")
    code = ("import sys; from trainer.core import capabilities as c; b = c.torch_build(); "
            "print(b.version, b.gpu, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    version, gpu, imported = out.stdout.split()
    assert (version, imported) == (build.version, "False"), out.stderr  # never imports torch (seconds)
    assert gpu == str(build.gpu)


@pytest.mark.slow  # a child process
def test_review_and_start_refuse_a_gpu_plan_with_a_cpu_only_torch(monkeypatch, tmp_path):
    """Issue 29 item 3: device auto, a (replayed) GPU, a CPU-only PyTorch: Review and Start say the same, before
    anything starts, naming the GPU, the recording, the build and the fix; no fit verdict changes for it."""
    from trainer.planning.verdict import model_verdict

    write_demo_data(tmp_path / "train.jsonl", 20)
    path = write_workspace_config(tmp_path, {"device": "auto", "method.type": "lora", "speed.precision": "auto",
                                   "output.runs_dir": str(tmp_path / "runs")})
    _stand_in_torch(monkeypatch, None)
    ready = preflight.start_problems(tc.load(path), _laptop(), run_dir=tmp_path / "runs" / "r")
    assert ready.plan.resolved.device == "cuda"
    (field, message), = [p for p in ready.problems if p[0] == "device"]
    for words in ("RTX 4090 Laptop GPU", "rtx4090_laptop_16gb.jsonl", "CPU-only build", "set device: cpu"):
        assert words in message, message
    verdicts = model_verdict(tc.load(path), _laptop()).methods
    # the device is a start problem, not a fit verdict; only QLoRA's 4-bit weights need the CUDA build themselves,
    # and its verdict says so as the Environment page does (issue 41 walkthrough 8: one answer)
    assert verdicts and all("a CUDA build of PyTorch" not in v.needs for m, v in verdicts.items() if m != "qlora")
    assert "a CUDA build of PyTorch" in verdicts["qlora"].needs
    start = run_cli(["run", str(path), "--hardware", str(LAPTOP), "--run-dir", str(tmp_path / "runs" / "r")],
                    cwd=tmp_path, python_code=_torch_code(None))
    assert start.returncode == 2 and f"{field}: {message}" in start.stderr, start.stderr
    assert "Traceback" not in start.stderr and not (tmp_path / "runs").exists()
    _stand_in_torch(monkeypatch, "12.8")  # the same machine with a CUDA build: nothing to say
    assert not [p for p in preflight.start_problems(tc.load(path), _laptop()).problems if p[0] == "device"]
    _stand_in_torch(monkeypatch, None)
    cpu = preflight.start_problems(tc.load(write_workspace_config(tmp_path, {"device": "cpu"})), _laptop())
    assert cpu.ready, cpu.problems  # the fix the message gives
