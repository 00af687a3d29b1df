"""Processes on the GPU that belong to the desktop itself (never worth closing): one list, used by the
planner's "close these apps" and the GUI's warnings alike."""
from __future__ import annotations

DESKTOP_PROCESSES = frozenset({
    # Linux display servers and compositors
    "xorg", "xwayland", "gnome-shell", "kwin_x11", "kwin_wayland", "plasmashell", "mutter", "sway", "weston",
    "gdm-x-session",
    # the Windows shell and its helpers
    "system", "dwm.exe", "csrss.exe", "explorer.exe", "winlogon.exe", "searchhost.exe",
    "shellexperiencehost.exe", "startmenuexperiencehost.exe", "textinputhost.exe",
})


def is_desktop_process(name: str) -> bool:
    """True for the display server, compositor or Windows shell (case-insensitive executable name)."""
    return name.lower() in DESKTOP_PROCESSES
