"""The one process-tree killer (supervisor's last resort, the GUI's Kill): light, psutil only."""
from __future__ import annotations

import psutil


def kill_tree(pid: int, timeout_s: float = 10.0) -> int:
    """Kill process ``pid`` and all its descendants; wait up to ``timeout_s`` seconds for them to
    go. Returns how many processes were signalled (0 when ``pid`` was already gone). Blocks: call
    it off a GUI thread."""
    try:
        parent = psutil.Process(pid)
        procs = parent.children(recursive=True) + [parent]
    except psutil.NoSuchProcess:
        return 0
    signalled = []
    for p in procs:
        try:
            p.kill()
            signalled.append(p)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(signalled, timeout=timeout_s)
    return len(signalled)


def end_process(pid: int, timeout_s: float = 5.0) -> bool:
    """Terminate one process, killing it after ``timeout_s`` seconds. True when it ended, False
    when it was gone already or is not ours to end. Blocks: call it off a GUI thread."""
    try:
        p = psutil.Process(pid)
        p.terminate()
        p.wait(timeout=timeout_s)
        return True
    except psutil.TimeoutExpired:
        p.kill()
        return True
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
