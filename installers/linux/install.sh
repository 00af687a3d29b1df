#!/usr/bin/env bash
# Install TrainPilot for this user: its own virtual environment in PREFIX, the PyTorch build that
# fits the NVIDIA GPU and driver (installers/torch_build.py decides and says why), TrainPilot itself,
# DeepSpeed when it works, the GPU extras beside a CUDA PyTorch (bitsandbytes for QLoRA and 8-bit AdamW, liger-kernel
# for Liger's fused loss, torchvision paired with that PyTorch: installers/gpu_extras.py decides and says why), llama.cpp's GGUF converter
# (PREFIX/llama.cpp), a menu entry with the icon, and `trainpilot` / `trainpilot-cli` commands.
# Running it again repairs or updates the same PREFIX. Every step is logged to PREFIX/install.log.
set -Eeuo pipefail

usage() {
  cat <<'EOF'
Usage: installers/linux/install.sh [options]

  --prefix DIR              where to install (default: ~/.local/share/trainpilot)
  --python PY               Python 3.10+ to build the environment from (default: newest found)
  --torch-build TAG         auto (default), cpu, cu118, cu126, cu128, cu130
  --upgrade                 also upgrade PyTorch and the other packages to their newest releases
  --no-deepspeed            do not try DeepSpeed
  --no-gpu-extras           do not try bitsandbytes, liger-kernel and torchvision (only beside a CUDA PyTorch)
  --no-llama-cpp            do not build llama-cpp-python (exports are then written but not verified in llama.cpp)
  --no-desktop              no menu entry, icons or ~/.local/bin commands
  --editable                run from this source tree instead of a copy in PREFIX/src (developers)
  --system-libs ask|yes|no  the X11 libraries Qt needs (libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1):
                            ask before installing them with sudo apt-get (default), install, or only
                            explain what is missing
Offline installs (no network at all; used by CI):
  --offline                 pip never uses an index: packages come from --wheelhouse and/or
                            the reused site-packages below
  --wheelhouse DIR          a folder of wheels (pip --find-links); repeatable
  --reuse-site-packages DIR let the environment import the packages already in DIR; repeatable
  --system-site-packages    let the environment see the base Python's site-packages
EOF
}

REPO="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.." && pwd)"
PREFIX="${XDG_DATA_HOME:-$HOME/.local/share}/trainpilot"
SYSTEM_LIBS="ask"; PYTHON=""; TORCH_BUILD="auto"; UPGRADE=0; DEEPSPEED=1; GPU_EXTRAS=1; DESKTOP=1; EDITABLE=0; OFFLINE=0
SYSTEM_SITE=0; LLAMA_CPP=1
WHEELHOUSES=(); REUSE=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --prefix) PREFIX="$2"; shift 2 ;;
    --python) PYTHON="$2"; shift 2 ;;
    --torch-build) TORCH_BUILD="$2"; shift 2 ;;
    --upgrade) UPGRADE=1; shift ;;
    --no-deepspeed) DEEPSPEED=0; shift ;;
    --no-gpu-extras) GPU_EXTRAS=0; shift ;;
    --no-llama-cpp) LLAMA_CPP=0; shift ;;
    --no-desktop) DESKTOP=0; shift ;;
    --editable) EDITABLE=1; shift ;;
    --system-libs) SYSTEM_LIBS="$2"; shift 2 ;;
    --offline) OFFLINE=1; shift ;;
    --wheelhouse) WHEELHOUSES+=("$(readlink -f "$2")"); shift 2 ;;
    --reuse-site-packages) REUSE+=("$(readlink -f "$2")"); shift 2 ;;
    --system-site-packages) SYSTEM_SITE=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

mkdir -p "$PREFIX"
PREFIX="$(cd "$PREFIX" && pwd)"
VENV="$PREFIX/venv"
VPY="$VENV/bin/python"
LOG="$PREFIX/install.log"
STEP="starting"; HINT=""
exec > >(tee -a "$LOG") 2>&1
echo "=== TrainPilot install $(date -u +%Y-%m-%dT%H:%M:%SZ): prefix=$PREFIX source=$REPO args: $*"

step() { STEP="$1"; HINT="$2"; echo; echo "--- $STEP"; }
fail() {  # the one place an install ends badly: plain words, what to do, where the log is
  echo
  echo "TrainPilot install FAILED while: $STEP"
  [[ -n "${1:-}" ]] && echo "  $1"
  [[ -n "$HINT" ]] && echo "What to do: $HINT"
  echo "Full log: $LOG"
  exit 1
}
trap 'fail "a command exited with status $? (line $LINENO)"' ERR

PIP_ARGS=(--disable-pip-version-check)
if (( OFFLINE )); then PIP_ARGS+=(--no-index); fi
for wh in "${WHEELHOUSES[@]}"; do PIP_ARGS+=(--find-links "$wh"); done
pip_install() { "$VPY" -m pip install "${PIP_ARGS[@]}" "$@"; }

find_python() {  # newest Python 3.10+ on PATH, or the one given
  local candidates=("$PYTHON") c
  [[ -n "$PYTHON" ]] || candidates=(python3.13 python3.12 python3.11 python3.10 python3)
  for c in "${candidates[@]}"; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys, venv; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
      command -v "$c"; return 0
    fi
  done
  return 1
}

make_venv() {
  if [[ -x "$VPY" ]] && "$VPY" -c 'import sys' 2>/dev/null; then
    echo "Reusing the environment in $VENV"
  else
    rm -rf "$VENV"
    local args=()
    (( SYSTEM_SITE )) && args+=(--system-site-packages)
    # Reusing another environment's packages: take pip and setuptools from there too, so the
    # environment needs nothing from the network.
    (( ${#REUSE[@]} )) && args+=(--without-pip)
    "$BASE_PY" -m venv "${args[@]}" "$VENV"
  fi
  local site; site="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  rm -f "$site/_trainpilot_reuse.pth"
  # Plain path lines: the reused folders come after the environment's own packages, and their
  # .pth files are not run, so an editable install living there cannot shadow ours.
  (( ${#REUSE[@]} )) && printf '%s\n' "${REUSE[@]}" > "$site/_trainpilot_reuse.pth"
  "$VPY" -m pip --version >/dev/null 2>&1 || "$VPY" -m ensurepip --default-pip
  "$VPY" -m pip --version
}

install_source() {
  if (( EDITABLE )); then SRC="$REPO"; return; fi
  SRC="$PREFIX/src"
  if [[ "$(readlink -f "$REPO")" != "$(readlink -f "$SRC")" ]]; then
    rm -rf "$SRC.new"; mkdir -p "$SRC.new"
    # configs/ (the presets and the demo config) is found beside trainer/ by the editable install, and
    # setup.py says how the wheel packages it.
    local item
    for item in app trainer configs installers pyproject.toml setup.py README.md LICENSE; do
      if [[ -e "$REPO/$item" ]]; then cp -a "$REPO/$item" "$SRC.new/"; fi
    done
    find "$SRC.new" -name __pycache__ -type d -prune -exec rm -rf {} +
    [[ -f "$SRC.new/README.md" ]] || echo "# TrainPilot" > "$SRC.new/README.md"  # pyproject's readme
    rm -rf "$SRC"; mv "$SRC.new" "$SRC"
  fi
}

torch_ok() {  # does the environment's torch match the build we want? (0 = yes)
  "$VPY" - "$1" <<'EOF' 2>/dev/null
import sys
import torch
want = sys.argv[1]
have = torch.__version__.split("+", 1)[1] if "+" in torch.__version__ else ("cpu" if not torch.version.cuda else "cu" + torch.version.cuda.replace(".", ""))
sys.exit(0 if have == want else 1)
EOF
}

install_torch() {
  if [[ "$TP_OK" != 1 ]]; then HINT="$TP_REASON"; fail "No PyTorch build fits this machine."; fi
  if (( ! UPGRADE )) && torch_ok "$TP_BUILD"; then
    echo "PyTorch build $TP_BUILD is already installed: $("$VPY" -c 'import torch; print(torch.__version__)')"
    return
  fi
  if (( OFFLINE )); then
    if "$VPY" -c 'import torch' 2>/dev/null; then
      echo "Offline: keeping the installed PyTorch $("$VPY" -c 'import torch; print(torch.__version__)') (wanted build $TP_BUILD)."
      return
    fi
    pip_install "$TP_TORCH_REQ" && return
    HINT="Put a torch wheel for build $TP_BUILD in a --wheelhouse folder, or install online."; fail
  fi
  local build up=(); (( UPGRADE )) && up=(--upgrade)
  # A torch of another build satisfies the requirement, so pip would keep it: remove it first.
  if "$VPY" -c 'import torch' >/dev/null 2>&1; then "$VPY" -m pip uninstall -y torch; fi
  for build in "$TP_BUILD" $TP_FALLBACKS; do
    echo "Installing PyTorch ($build) from https://download.pytorch.org/whl/$build"
    local req; req="$("$TP_PY" "$REPO/installers/torch_build.py" --build "$build" --json | "$TP_PY" -c 'import json,sys; print(json.load(sys.stdin)["torch_requirement"])')"
    # The PyTorch index serves torch's dependencies too; PyPI is left out on purpose, or pip could
    # take a newer public torch (CPU-only on Windows) over the CUDA build.
    if pip_install "${up[@]}" "$req" --index-url "https://download.pytorch.org/whl/$build"; then
      # A pip.conf with extra indexes or find-links can hand over another build: check, never assume.
      if torch_ok "$build"; then TP_BUILD="$build"; return; fi
      echo "pip installed PyTorch $("$VPY" -c 'import torch; print(torch.__version__)' 2>&1 | tail -1), not the $build build (check pip.conf / PIP_* settings)."
      "$VPY" -m pip uninstall -y torch || true
    fi
    echo "PyTorch build $build did not install; trying the next one."
  done
  fail "PyTorch did not install from any of: $TP_BUILD $TP_FALLBACKS"
}

install_deepspeed() {
  DS_ERROR=""
  (( DEEPSPEED )) || return 0
  if "$VPY" -c 'import deepspeed' >/dev/null 2>&1 && (( ! UPGRADE )); then echo "DeepSpeed is already installed."; return 0; fi
  # DS_BUILD_OPS=0: no compiling at install; DeepSpeed builds the ops it needs at first use.
  # --no-build-isolation: its setup.py must see the torch we just installed, not download another.
  local up=(); (( UPGRADE )) && up=(--upgrade)
  # Without build isolation its setup.py runs in this environment, which (Python 3.12+) has no
  # setuptools of its own.
  if (( ! OFFLINE )); then pip_install setuptools wheel packaging || true; fi
  if ! DS_BUILD_OPS=0 timeout 1800 "$VPY" -m pip install "${PIP_ARGS[@]}" "${up[@]}" --no-build-isolation deepspeed; then
    DS_ERROR="pip could not install DeepSpeed (see install.log); TrainPilot uses its non-DeepSpeed presets."
    echo "$DS_ERROR"
  fi
  return 0
}

installed_build() {  # the build tag of the environment's torch (cpu, cu126...), as install_state.py reads it
  "$VPY" - <<'EOF' 2>/dev/null || echo none
import torch
v = torch.__version__
print(v.split("+", 1)[1] if "+" in v else ("cu" + torch.version.cuda.replace(".", "")[:3] if torch.version.cuda else "cpu"))
EOF
}

install_gpu_extras() {  # bitsandbytes, liger-kernel and torchvision beside a CUDA PyTorch (installers/gpu_extras.py says why)
  EXTRA_ERRORS=()
  rm -f "$PREFIX/gpu-extras.json"
  (( GPU_EXTRAS )) || { echo "Skipped (--no-gpu-extras)."; return 0; }
  local build triton=no key install extra reason pip up=() plan=() tv=()
  build="$(installed_build)"
  if "$VPY" -c 'import triton' >/dev/null 2>&1; then triton=yes; fi
  plan=(--torch-build "$build" --triton "$triton" --torch-version "$("$VPY" -c 'import torch; print(torch.__version__)' 2>/dev/null)")
  (( OFFLINE )) && plan+=(--offline)
  "$VPY" "$REPO/installers/gpu_extras.py" "${plan[@]}" --json > "$PREFIX/gpu-extras.json"
  eval "$("$VPY" "$REPO/installers/gpu_extras.py" "${plan[@]}" --env)"
  (( UPGRADE )) && up=(--upgrade)
  for key in BNB LIGER TV; do
    install="TP_${key}_INSTALL"; extra="TP_${key}_EXTRA"; reason="TP_${key}_REASON"; pip="TP_${key}_PIP"
    echo "${!reason}"
    [[ ${!install} == 1 ]] || continue
    if [[ -n "${!pip}" ]]; then  # torchvision: the release paired with the installed torch, which stays pinned
      eval "tv=(${!pip})"
      if ! pip_install "${tv[@]}"; then
        EXTRA_ERRORS+=(--extra-error "torchvision=pip could not install it (see install.log); only Qwen2.5-VL's and Qwen3-VL's processors need it")
        echo "It did not install; only Qwen2.5-VL's and Qwen3-VL's processors need it (see install.log)."
      fi
      continue
    fi
    # The extra pins the version (pyproject.toml); torch is already satisfied, so pip keeps the CUDA build.
    if ! pip_install "${NOBI[@]}" "${up[@]}" -e "${SRC}[${!extra}]"; then
      EXTRA_ERRORS+=(--extra-error "${!extra}=pip could not install it (see install.log); TrainPilot works without it")
      echo "It did not install; TrainPilot works without it (see install.log)."
    fi
  done
  return 0
}

# llama-cpp-python runs llama.cpp itself: export-model verifies every GGUF export in it (and quantizes to Q4_K_M).
# PyPI has only its source, so it is built here (a C++ compiler; ~10-15 minutes on 2 cores) or taken as a wheel
# from --wheelhouse offline. Its failure never fails the install: exports are then written and say "not verified".
LLAMA_CPP_PYTHON="llama-cpp-python==0.3.36"
install_llama_cpp_python() {
  LLAMA_NOTE=""
  (( LLAMA_CPP )) || { LLAMA_NOTE="skipped (--no-llama-cpp)"; return 0; }
  if "$VPY" -c 'import llama_cpp' >/dev/null 2>&1 && (( ! UPGRADE )); then echo "llama-cpp-python is already installed."; return 0; fi
  if (( OFFLINE )); then  # a prebuilt wheel from the wheelhouse only: no 15-minute build in an offline install
    pip_install --only-binary llama-cpp-python "$LLAMA_CPP_PYTHON" "diskcache>=5.6.1" \
      || LLAMA_NOTE="no llama-cpp-python wheel in the wheelhouse; exports are written but not verified in llama.cpp"
  elif ! command -v c++ >/dev/null 2>&1 && ! command -v g++ >/dev/null 2>&1; then
    LLAMA_NOTE="no C++ compiler to build llama-cpp-python (Debian/Ubuntu: sudo apt-get install build-essential, then run the installer again); exports are written but not verified in llama.cpp"
  else
    echo "Building llama-cpp-python (llama.cpp for Python): about 10-15 minutes."
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF" \
      timeout 3600 "$VPY" -m pip install "${PIP_ARGS[@]}" "$LLAMA_CPP_PYTHON" \
      || LLAMA_NOTE="llama-cpp-python did not build (see install.log); exports are written but not verified in llama.cpp"
  fi
  [[ -n "$LLAMA_NOTE" ]] && echo "$LLAMA_NOTE"
  return 0
}

# Qt's X11 platform plugin needs these; minimal desktops and containers often lack them, and Qt
# alone says only "could not load the Qt platform plugin xcb". Checked with the dynamic loader's
# cache; installed only with consent (a question, or --system-libs yes).
QT_XCB_LIBS=("libxcb-cursor.so.0:libxcb-cursor0" "libxcb-icccm.so.4:libxcb-icccm4" "libxcb-keysyms.so.1:libxcb-keysyms1")
check_qt_libs() {
  local entry missing=()
  for entry in "${QT_XCB_LIBS[@]}"; do
    if ! /sbin/ldconfig -p 2>/dev/null | grep -q "${entry%%:*}"; then missing+=("${entry#*:}"); fi
  done
  if (( ${#missing[@]} == 0 )); then echo "The X11 libraries Qt needs are installed."; return 0; fi
  echo "The desktop app's window needs ${missing[*]} (Qt's X11/xcb platform plugin loads them);"
  echo "without them the app cannot open and says which one is missing. Training from the terminal works anyway."
  local answer="n"
  if [[ $SYSTEM_LIBS == yes ]]; then answer="y"
  elif [[ $SYSTEM_LIBS == ask && -t 0 ]] && command -v apt-get >/dev/null; then
    read -r -p "Install them now with 'sudo apt-get install ${missing[*]}'? [y/N] " answer || answer="n"
  fi
  if [[ $answer == [yY]* ]] && command -v apt-get >/dev/null; then
    local sudo=(); (( EUID == 0 )) || sudo=(sudo)
    if "${sudo[@]}" apt-get install -y "${missing[@]}"; then echo "Installed ${missing[*]}."; return 0; fi
    echo "apt-get could not install them; install them yourself (command below)."
  fi
  echo "To install them later:  sudo apt-get install ${missing[*]}"
  echo "  (Fedora: sudo dnf install xcb-util-cursor xcb-util-wm xcb-util-keysyms; Arch: sudo pacman -S xcb-util-cursor xcb-util-wm xcb-util-keysyms)"
  return 0
}

install_desktop() {
  local data="${XDG_DATA_HOME:-$HOME/.local/share}" bin="${XDG_BIN_HOME:-$HOME/.local/bin}" size
  local icons="$SRC/app/resources/icons"
  for size in 16 24 32 48 64 128 256; do
    install -D -m 644 "$icons/trainpilot-$size.png" "$data/icons/hicolor/${size}x${size}/apps/trainpilot.png"
  done
  install -D -m 644 "$icons/trainpilot.svg" "$data/icons/hicolor/scalable/apps/trainpilot.svg"
  mkdir -p "$data/applications"
  # Exec must be absolute (menus do not read the user's PATH) and quoted (the prefix may have spaces).
  sed -e "s|^Exec=.*|Exec=\"$PREFIX/launch.sh\"|" -e "s|^TryExec=.*|TryExec=$PREFIX/launch.sh|" \
      "$REPO/installers/linux/trainpilot.desktop" > "$data/applications/trainpilot.desktop"
  chmod 644 "$data/applications/trainpilot.desktop"
  # Menus and icon themes pick the files up without these; they only make it immediate.
  if command -v update-desktop-database >/dev/null; then update-desktop-database -q "$data/applications" || true; fi
  if command -v gtk-update-icon-cache >/dev/null; then gtk-update-icon-cache -q -t "$data/icons/hicolor" 2>/dev/null || true; fi
  mkdir -p "$bin"
  local name target
  for name in trainpilot trainpilot-cli; do
    target="$PREFIX/launch.sh"; [[ $name == trainpilot-cli ]] && target="$VENV/bin/trainpilot-cli"
    if [[ -e "$bin/$name" && ! -L "$bin/$name" ]]; then echo "Leaving $bin/$name alone (not ours)."; continue; fi
    ln -sfn "$target" "$bin/$name"
  done
  echo "Menu entry: $data/applications/trainpilot.desktop; commands in $bin"
  case ":$PATH:" in *":$bin:"*) ;; *) echo "Note: $bin is not on your PATH; add it to run 'trainpilot' from a terminal." ;; esac
}

step "checking the TrainPilot folder" "Run installers/linux/install.sh from a complete TrainPilot checkout."
[[ -f "$REPO/pyproject.toml" ]] || fail "$REPO does not hold the TrainPilot sources."

step "finding Python 3.10 or newer" "Install Python 3.10+ with venv (Debian/Ubuntu: sudo apt install python3 python3-venv), or pass --python /path/to/python3."
BASE_PY="$(find_python)" || fail "No Python 3.10+ with the venv module was found."
echo "Using $BASE_PY ($("$BASE_PY" --version 2>&1))"
TP_PY="$BASE_PY"

step "creating the environment in $VENV" "Check free disk space in $PREFIX; on Debian/Ubuntu install python3-venv. Re-running the installer recreates a broken environment."
make_venv

step "choosing the PyTorch build for this GPU" "Run 'nvidia-smi' to check the NVIDIA driver, or pass --torch-build cpu."
"$TP_PY" "$REPO/installers/torch_build.py" --build "$TORCH_BUILD" --json > "$PREFIX/torch-decision.json" || true
eval "$("$TP_PY" "$REPO/installers/torch_build.py" --build "$TORCH_BUILD" --env || true)"
echo "GPU: ${TP_GPU:-none found}"
echo "PyTorch build: $TP_BUILD. $TP_REASON"

step "installing PyTorch ($TP_BUILD)" "Check the network connection to download.pytorch.org (several GB for CUDA builds) and free disk space, then run the installer again."
install_torch

step "installing TrainPilot" "Check the network connection (or the wheelhouse in offline mode) and run the installer again."
install_source
NOBI=(); (( ${#REUSE[@]} || OFFLINE )) && NOBI=(--no-build-isolation)  # build with what is installed
pip_install "${NOBI[@]}" -e "${SRC}[gui,train]"

step "trying DeepSpeed" ""
install_deepspeed

step "trying the GPU extras" ""
install_gpu_extras

# export-model --gguf runs llama.cpp's own converter from the pinned llama-cpp-python sources;
# without them everything else works and GGUF export says how to add them.
step "fetching llama.cpp's GGUF converter" ""
FETCH=(--dest "$PREFIX/llama.cpp"); (( OFFLINE )) && FETCH+=(--offline)
for wh in "${WHEELHOUSES[@]}"; do FETCH+=(--find-links "$wh"); done
"$VPY" "$REPO/installers/fetch_llama_cpp.py" "${FETCH[@]}" || echo "(only GGUF export needs it; see the line above)"

step "installing llama.cpp for Python (verifies GGUF exports)" ""
install_llama_cpp_python

step "installing the launcher" "Check that $PREFIX is writable."
install -m 755 "$REPO/installers/linux/launch.sh" "$PREFIX/launch.sh"
if (( DESKTOP )); then install_desktop; fi

step "checking the libraries the desktop window needs" ""
if [[ $(uname -s) == Linux ]]; then check_qt_libs; fi

step "checking the installation" "Read the messages above: PyTorch must import. Re-run the installer to repair."
STATE_ARGS=(--prefix "$PREFIX" --venv-python "$VPY" --source "$SRC" --decision "$PREFIX/torch-decision.json")
(( OFFLINE )) && STATE_ARGS+=(--offline)
(( DEEPSPEED )) || STATE_ARGS+=(--skip-deepspeed)
[[ -n "$DS_ERROR" ]] && STATE_ARGS+=(--deepspeed-install-error "$DS_ERROR")
[[ -f "$PREFIX/gpu-extras.json" ]] && STATE_ARGS+=(--gpu-extras "$PREFIX/gpu-extras.json")
(( ${#EXTRA_ERRORS[@]} )) && STATE_ARGS+=("${EXTRA_ERRORS[@]}")
"$VPY" "$REPO/installers/install_state.py" "${STATE_ARGS[@]}"
"$VENV/bin/trainpilot-cli" doctor || echo "(trainpilot-cli doctor reported problems: see above)"

echo
echo "TrainPilot is installed in $PREFIX."
echo "Start it from your applications menu, or run: $PREFIX/launch.sh"
