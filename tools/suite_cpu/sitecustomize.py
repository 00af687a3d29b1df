"""Where a test run's CPU goes, process by process (tools/suite_cpu.py reads what this writes).

With ``TRAINPILOT_PROCLOG=FILE`` and this folder first on ``PYTHONPATH``, every Python process started from that
environment appends one JSON line to FILE as it ends (``atexit``, or ``os._exit`` as launched ranks leave): its
command line, its own user and system CPU seconds, its wall time, the test that started it
(``PYTEST_CURRENT_TEST``) and whether it imported torch / transformers' modeling code. A process killed by a signal
writes nothing. Without the variable it does nothing.
"""
import atexit
import json
import os
import sys
import time

_T0 = time.time()
_LOG = os.environ.get("TRAINPILOT_PROCLOG")
_DONE = [False]


def _log(code=None):
    if _DONE[0] or not _LOG:
        return
    _DONE[0] = True
    try:
        t = os.times()
        rec = {"pid": os.getpid(), "argv": sys.argv[:6], "user": t.user, "sys": t.system, "wall": time.time() - _T0,
               "test": os.environ.get("PYTEST_CURRENT_TEST", ""), "xdist": os.environ.get("PYTEST_XDIST_WORKER", ""),
               "torch": "torch" in sys.modules, "transformers": "transformers.modeling_utils" in sys.modules}
        with open(_LOG, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
    except Exception:  # noqa: BLE001 - a measurement must never fail the process it measures
        pass


if _LOG:
    atexit.register(_log)
    _exit = os._exit

    def _logged_exit(code):
        _log(code)
        _exit(code)

    os._exit = _logged_exit
