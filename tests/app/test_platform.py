"""A minimal Linux desktop: when a library Qt's xcb plugin needs is missing, the app says which one
and how to install it, instead of Qt's generic "could not load the Qt platform plugin"."""
from __future__ import annotations

import os
import subprocess
import sys

from app.ops import platform_check as pc


def test_package_names_and_message():
    assert pc.package_for("libxcb-icccm.so.4") == "libxcb-icccm4"
    assert pc.package_for("libxcb-render-util.so.0") == "libxcb-render-util0"
    text = pc.explain(["libxcb-cursor.so.0", "libxcb-keysyms.so.1"])
    assert "libxcb-cursor.so.0" in text and "sudo apt-get install libxcb-cursor0 libxcb-keysyms1" in text


def test_xcb_is_detected_only_where_qt_will_use_it():
    linux = sys.platform.startswith("linux")
    assert pc.uses_xcb({"DISPLAY": ":0"}) == linux
    assert not pc.uses_xcb({"DISPLAY": ":0", "QT_QPA_PLATFORM": "offscreen"})
    assert not pc.uses_xcb({"DISPLAY": ":0", "WAYLAND_DISPLAY": "wayland-0"})
    assert pc.uses_xcb({"QT_QPA_PLATFORM": "xcb"}) == linux


def test_a_missing_library_is_found_by_the_real_loader():
    missing = pc.missing_libraries(wanted={"libxcb-not-here.so.9": "libxcb-not-here9", "libc.so.6": "libc6"})
    assert "libxcb-not-here.so.9" in missing and "libc.so.6" not in missing


def test_app_names_the_missing_library_and_exits(tmp_path):
    """The real entry point, on an X display, with a library that no system has: one clear message, exit 1."""
    code = ("import sys; from app.ops import platform_check as pc; pc.XCB_LIBRARIES['libxcb-not-here.so.9'] = "
            "'libxcb-not-here9'; from app.main import main; sys.exit(main([]))")
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY")}
    env.update(DISPLAY=":987", TRAINPILOT_HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    if not sys.platform.startswith("linux"):
        return
    assert out.returncode == 1, out.stderr
    install = next((line for line in out.stderr.splitlines() if "sudo apt-get install" in line), "")
    # the fake library's package is among those to install (a machine without Qt's real xcb libraries lists them too)
    assert "libxcb-not-here.so.9" in out.stderr and "libxcb-not-here9" in install.split(), out.stderr
    assert "Traceback" not in out.stderr and "could not load the Qt platform plugin" not in out.stderr
