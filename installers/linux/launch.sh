#!/usr/bin/env bash
# Start the TrainPilot GUI from any current directory. The installer copies this file into its
# prefix, so the prefix is this file's own folder; run from the source tree, it falls back to
# $TRAINPILOT_PREFIX or the default prefix. Arguments are passed to the GUI.
set -euo pipefail
here="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)"
if [[ -x "$here/venv/bin/trainpilot" ]]; then
  prefix="$here"
else
  prefix="${TRAINPILOT_PREFIX:-${XDG_DATA_HOME:-$HOME/.local/share}/trainpilot}"
fi
if [[ ! -x "$prefix/venv/bin/trainpilot" ]]; then
  echo "TrainPilot is not installed in $prefix." >&2
  echo "Install it with: installers/linux/install.sh (see docs/install.md)." >&2
  exit 1
fi
export TRAINPILOT_INSTALL_STATE="$prefix/install-state.json"
exec "$prefix/venv/bin/trainpilot" "$@"
