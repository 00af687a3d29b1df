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
# DeepSpeed builds against the installed torch, so it goes after it and without build isolation.
if ! pip install -q --no-build-isolation deepspeed; then
  echo "DeepSpeed did not install: TrainPilot works without it (no ZeRO offload); see README troubleshooting." >&2
fi
if [ "${1:-}" = "--dev" ]; then
  # Parses the Windows PowerShell installer in tests (no pwsh on Linux CI).
  pip install -q tree-sitter tree-sitter-powershell || echo "tree-sitter not installed: the PowerShell parse test skips" >&2
fi
echo "ready: . .venv/bin/activate  (trainpilot-cli demo | trainpilot | python -m pytest)"
