"""Before Qt opens a window on Linux: are the libraries its xcb platform plugin needs installed?

Qt alone says only "could not load the Qt platform plugin 'xcb'". This names the missing library,
its Debian/Ubuntu package and the command that installs it (standard library only: it runs before
anything else is imported)."""
from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path

# Libraries Qt's xcb plugin needs that minimal desktops (and containers) often lack, with their
# Debian/Ubuntu packages. libxcb-cursor is loaded at run time, so ldd does not list it.
XCB_LIBRARIES = {
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
}


def uses_xcb(env: dict | None = None) -> bool:
    """True when Qt will try the xcb (X11) platform: Linux, an X display, no other platform chosen."""
    env = os.environ if env is None else env
    if not sys.platform.startswith("linux"):
        return False
    chosen = env.get("QT_QPA_PLATFORM", "")
    if chosen:
        return chosen.split(";")[0].split(":")[0] == "xcb"
    return bool(env.get("DISPLAY")) and not env.get("WAYLAND_DISPLAY")


def xcb_plugin() -> Path | None:
    """The xcb platform plugin of the installed PySide6, or None."""
    try:
        import PySide6  # light: the package's __init__, not QtWidgets
    except ImportError:
        return None
    path = Path(PySide6.__file__).parent / "Qt" / "plugins" / "platforms" / "libqxcb.so"
    return path if path.is_file() else None


def missing_libraries(plugin: Path | None = None, wanted: dict[str, str] | None = None) -> list[str]:
    """Library file names the xcb plugin needs that the dynamic loader cannot find."""
    missing = []
    for lib in (XCB_LIBRARIES if wanted is None else wanted):
        try:
            ctypes.CDLL(lib)
        except OSError:
            missing.append(lib)
    plugin = plugin or xcb_plugin()
    if plugin is not None:
        qt_lib = plugin.parents[2] / "lib" / "libQt6XcbQpa.so.6"
        for target in (plugin, qt_lib):
            for lib in _ldd_not_found(target):
                if lib not in missing:
                    missing.append(lib)
    return missing


def _ldd_not_found(path: Path) -> list[str]:
    if not path.is_file():
        return []
    try:
        out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return re.findall(r"^\s*(\S+) => not found", out, flags=re.M)


def package_for(lib: str) -> str:
    """The Debian/Ubuntu package of a library file ('libxcb-icccm.so.4' → 'libxcb-icccm4')."""
    if lib in XCB_LIBRARIES:
        return XCB_LIBRARIES[lib]
    m = re.match(r"(lib[\w+-]+?)\.so\.(\d+)", lib)
    if not m:
        return lib
    name, major = m.groups()
    return f"{name}-{major}" if name[-1].isdigit() else f"{name}{major}"


def explain(missing: list[str]) -> str:
    """The message for a user whose desktop lacks ``missing`` libraries."""
    packages = " ".join(dict.fromkeys(package_for(lib) for lib in missing))
    return ("TrainPilot cannot open its window yet: Qt's X11 (xcb) platform plugin needs "
            + ", ".join(missing) + ", which this system does not have.\n"
            f"Install them (Debian/Ubuntu):  sudo apt-get install {packages}\n"
            "Fedora: sudo dnf install xcb-util-cursor xcb-util-wm xcb-util-keysyms   "
            "Arch: sudo pacman -S xcb-util-cursor xcb-util-wm xcb-util-keysyms\n"
            "Then start TrainPilot again. (installers/linux/install.sh checks for these and offers to install them.)")


def check(stream=None) -> bool:
    """Print the explanation to ``stream`` (stderr) when xcb will be used and libraries are
    missing. Returns True when all is well (or xcb is not used)."""
    if not uses_xcb():
        return True
    missing = missing_libraries()
    if missing:
        print(explain(missing), file=stream or sys.stderr, flush=True)
    return not missing
