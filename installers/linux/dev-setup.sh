#!/usr/bin/env bash
# Developer and CI setup on Linux: ./.venv with PyTorch's CPU build, TrainPilot (GUI + trainer), DeepSpeed.
# Users install with installers/linux/install.sh instead (it picks the CUDA build for their GPU).
#   bash installers/linux/dev-setup.sh          # enough for `trainpilot-cli demo` and the GUI
#   bash installers/linux/dev-setup.sh --dev    # plus the test tools
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
pip install -q --upgrade pip
# The pinned CPU build: an unpinned torch pulls a multi-GB CUDA build.
pip install -q torch==2.13.0
extras="gui,train,secrets"
if [ "${1:-}" = "--dev" ]; then extras="$extras,dev"; fi
pip install -q -e ".[$extras]"
# DeepSpeed builds against the installed torch, so it goes after it and without build isolation. For the tests
# (--dev), its CPU ops (cpu_adam; the shared-memory comm of two-rank runs) are compiled into a wheel once (~4 min)
# and kept in the dev cache: otherwise every fresh .venv compiles them when first used (~65 s of a CI run's tests,
# with both test workers waiting on the build). Without a compiler the plain install below compiles nothing.
ds_installed=0
if [ "${1:-}" = "--dev" ]; then
  ds_wheels="${XDG_CACHE_HOME:-$HOME/.cache}/trainpilot-dev/wheels/deepspeed-0.19.8-torch-2.13.0-cpu"
  if ! ls "$ds_wheels"/deepspeed-0.19.8-*.whl >/dev/null 2>&1; then
    mkdir -p "$ds_wheels"
    DS_ACCELERATOR=cpu DS_BUILD_OPS=0 DS_BUILD_CPU_ADAM=1 DS_BUILD_SHM_COMM=1 \
      pip wheel -q --no-cache-dir --no-build-isolation --no-deps deepspeed==0.19.8 -w "$ds_wheels" \
      || echo "DeepSpeed's CPU ops did not build into a wheel: DeepSpeed compiles them when first used" >&2
  fi
  if ls "$ds_wheels"/deepspeed-0.19.8-*.whl >/dev/null 2>&1 \
      && pip install -q "$ds_wheels"/deepspeed-0.19.8-*.whl; then
    ds_installed=1
  fi
fi
if [ "$ds_installed" = 0 ] && ! pip install -q --no-build-isolation deepspeed; then
  echo "DeepSpeed did not install: TrainPilot works without it (no ZeRO offload); see README troubleshooting." >&2
fi
if [ "${1:-}" = "--dev" ]; then
  # Parses the Windows PowerShell installer in tests (no pwsh on Linux CI).
  pip install -q tree-sitter tree-sitter-powershell || echo "tree-sitter not installed: the PowerShell parse test skips" >&2
  # llama.cpp's vocab GGUFs, chat templates and converter, from the llama-cpp-python source distribution on
  # the package registry: tests/real_models.py builds the real-family test models from them. Never fatal.
  dev_cache="${XDG_CACHE_HOME:-$HOME/.cache}/trainpilot-dev"
  sdist="llama_cpp_python-0.3.36"
  if [ ! -d "$dev_cache/$sdist/vendor/llama.cpp/models" ]; then
    mkdir -p "$dev_cache"
    if pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$dev_cache" \
        && tar -xzf "$dev_cache/$sdist.tar.gz" -C "$dev_cache"; then
      echo "llama.cpp sources in $dev_cache/$sdist"
    else
      echo "llama-cpp-python 0.3.36 sdist not downloaded: the real-family tests skip" >&2
    fi
  fi
  # Build the tiny real-family models once (about a minute), so the tests find them cached.
  if [ -d "$dev_cache/$sdist/vendor/llama.cpp/models" ]; then
    python tests/real_models.py --build >/dev/null || echo "real-family test models not prebuilt: tests build them" >&2
    python tests/real_vlms.py --build >/dev/null || echo "tiny vision-language test models not prebuilt: tests build them" >&2
  fi
fi
echo "ready: . .venv/bin/activate  (trainpilot-cli demo | trainpilot | python -m pytest)"
