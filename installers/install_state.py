"""Probe an installed TrainPilot environment and write ``<prefix>/install-state.json``.

Both installers run this as the last step, with any Python; it starts the environment's own Python
(``--venv-python``) in child processes with time limits, so a hanging import cannot hang the
install. The app and ``trainpilot-cli doctor`` read the file to learn which PyTorch build is
installed and whether DeepSpeed works (when it does not, the planner uses the non-DeepSpeed presets).

Where the app finds it: ``$TRAINPILOT_INSTALL_STATE`` (the launchers set it), else
``Path(sys.prefix).parent / "install-state.json"`` (the environment lives in ``<prefix>/venv``).

Fields: ``schema`` (1), ``written`` (ISO time), ``platform``, ``prefix``, ``venv``, ``source``,
``offline``, ``torch_build`` (cpu/cu126/...), ``cuda`` (CUDA version of the installed torch or
null), ``deepspeed_ok``, ``bitsandbytes_ok``, ``liger_ok`` (bool: the package imports), and detail objects
``decision`` (torch_build.py's answer), ``torch`` and ``deepspeed`` (what the probes found, with ``error`` text
on failure) and ``gpu_extras`` (per package: ``planned`` and ``reason`` from gpu_extras.py, ``install_error``
when pip failed, the probe's ``version`` or ``error``).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

SCHEMA = 1

_TORCH_PROBE = """
import json, torch
info = {"version": torch.__version__, "cuda": torch.version.cuda, "cuda_available": False,
        "devices": [], "arch_list": []}
try:
    info["cuda_available"] = bool(torch.cuda.is_available())
    if info["cuda_available"]:
        info["arch_list"] = torch.cuda.get_arch_list()
        info["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
except Exception as exc:
    info["cuda_error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(info))
"""

# Importing deepspeed checks that it matches the installed torch; the accelerator name tells which
# device it would drive. Ops are JIT-built at first use, so this does not prove every op builds.
_DEEPSPEED_PROBE = """
import json, deepspeed
from deepspeed.accelerator import get_accelerator
print(json.dumps({"version": deepspeed.__version__, "accelerator": get_accelerator().device_name()}))
"""


# bitsandbytes and liger-kernel (with the Triton its kernels are written in), as installed next to that torch
_EXTRA_PROBES = {
    "bitsandbytes": """
import json, importlib.metadata, bitsandbytes
print(json.dumps({"version": importlib.metadata.version("bitsandbytes")}))
""",
    "liger-kernel": """
import json, importlib.metadata, liger_kernel, triton
print(json.dumps({"version": importlib.metadata.version("liger-kernel"), "triton": triton.__version__}))
""",
    # a torchvision built for another torch fails here ("operator torchvision::nms does not exist")
    "torchvision": """
import json, torchvision
print(json.dumps({"version": torchvision.__version__}))
""",
}
_EXTRA_KEYS = {"bitsandbytes": "bitsandbytes_ok", "liger-kernel": "liger_ok", "torchvision": "torchvision_ok"}
_EXTRA_OF = {"qlora": "bitsandbytes", "liger": "liger-kernel", "torchvision": "torchvision"}  # extra -> package


def probe(python: str, code: str, timeout_s: float) -> dict:
    """Run ``code`` in ``python``; its last stdout line as JSON, or ``{"error": ...}``."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", DS_BUILD_OPS="0")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    except OSError as exc:
        return {"error": f"could not start {python}: {exc}"}
    lines = [ln for ln in out.stdout.splitlines() if ln.strip().startswith("{")]
    if out.returncode == 0 and lines:
        try:
            return json.loads(lines[-1])
        except json.JSONDecodeError:
            pass
    tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
    return {"error": " | ".join(tail) or f"exit code {out.returncode}"}


def torch_build_tag(torch_info: dict) -> str | None:
    """``cpu``/``cu130``/... from a torch probe (version suffix first, then torch.version.cuda)."""
    version = torch_info.get("version") or ""
    if "+" in version:
        return version.split("+", 1)[1]
    cuda = torch_info.get("cuda")
    if cuda:
        return "cu" + cuda.replace(".", "")[:3]
    return "cpu" if version else None


def build_state(args: argparse.Namespace) -> dict:
    """Everything the state file holds, probing the environment."""
    decision = json.loads(Path(args.decision).read_text()) if args.decision else None
    torch_info = probe(args.venv_python, _TORCH_PROBE, args.timeout)
    if args.skip_deepspeed:
        ds = {"error": "skipped at install (--no-deepspeed)"}
    else:
        ds = probe(args.venv_python, _DEEPSPEED_PROBE, args.timeout)
    if args.deepspeed_install_error and "error" in ds:
        ds["install_error"] = args.deepspeed_install_error
    extras = gpu_extras_state(args)
    return {
        "schema": SCHEMA,
        "written": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.system().lower(),
        "prefix": str(Path(args.prefix).resolve()),
        "venv": str(Path(args.venv_python).parent.parent),
        "source": args.source,
        "offline": bool(args.offline),
        "torch_build": torch_build_tag(torch_info),
        "cuda": torch_info.get("cuda"),
        "deepspeed_ok": "error" not in ds,
        **{_EXTRA_KEYS[name]: "error" not in info for name, info in extras.items()},
        "decision": decision,
        "torch": torch_info,
        "deepspeed": ds,
        "gpu_extras": extras,
    }


def gpu_extras_state(args: argparse.Namespace) -> dict:
    """Per GPU extra: the installer's plan (``planned``, ``reason``), pip's failure, and what imports now."""
    plan = {e["name"]: e for e in json.loads(Path(args.gpu_extras).read_text())} if args.gpu_extras else {}
    errors = dict(item.split("=", 1) for item in args.extra_error)
    out = {}
    for name, code in _EXTRA_PROBES.items():
        info = probe(args.venv_python, code, args.timeout)
        planned = plan.get(name)
        info["planned"] = planned["install"] if planned else None
        info["reason"] = planned["reason"] if planned else "not tried (--no-gpu-extras)"
        error = next((text for extra, text in errors.items() if _EXTRA_OF.get(extra) == name), None)
        if error:
            info["install_error"] = error
        out[name] = info
    return out


def main(argv: list[str] | None = None) -> int:
    """Write the state file; exit 0 when torch imports, 1 when it does not (install is broken)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--venv-python", required=True)
    parser.add_argument("--source", default="")
    parser.add_argument("--decision", help="torch_build.py --json output file")
    parser.add_argument("--offline", action="store_true")
    parser.add_argument("--skip-deepspeed", action="store_true")
    parser.add_argument("--deepspeed-install-error", default="")
    parser.add_argument("--gpu-extras", help="gpu_extras.py --json output file (what the installer planned)")
    parser.add_argument("--extra-error", action="append", default=[], metavar="EXTRA=TEXT",
                        help="pip's failure for a pyproject extra (qlora, liger); repeatable")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per probe")
    args = parser.parse_args(argv)
    state = build_state(args)
    path = Path(args.prefix) / "install-state.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    ds = state["deepspeed"]
    print(f"PyTorch: {state['torch'].get('version', 'NOT WORKING: ' + str(state['torch'].get('error')))}"
          f" (build {state['torch_build']}, CUDA {state['cuda'] or 'none'},"
          f" GPU usable: {state['torch'].get('cuda_available', False)})")
    print(f"DeepSpeed: {'works, ' + ds['version'] if state['deepspeed_ok'] else 'not available: ' + ds['error']}")
    for name, info in state["gpu_extras"].items():
        print(f"{name}: {info['version'] if 'error' not in info else 'not available: ' + info['error']}")
    print(f"Wrote {path}")
    return 0 if "error" not in state["torch"] else 1


if __name__ == "__main__":
    sys.exit(main())
