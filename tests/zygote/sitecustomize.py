"""The shim of the test session's zygote (``zygote_server.py`` here says what and why): in a process started as
``python -m MODULE ARGS`` for one of the heavy TrainPilot modules below, while ``TRAINPILOT_ZYGOTE_SOCKET`` names a
running server, hand the command line, folder, environment and stdin/stdout/stderr to the server, forward signals to
the fork it starts, and end as that fork ended. When the server is not there or refuses (another interpreter, an
environment that differs), the process starts as usual. Standard library only: it runs in every Python process of
the test session. A ``sitecustomize`` later on ``sys.path`` (``tools/suite_cpu``'s) runs too."""
import os
import sys

# Written out, not imported from trainer/core/entrypoints.py: this shim runs in every Python process of the session
# and stays standard library only. tests/test_entrypoints.py fails when the two drift apart: every entry point is
# either forked (the three names below) or started as usual (STARTED_AS_USUAL, with why).
CLI = "trainer"  # forked for CLI_COMMANDS only
WORKER = "trainer.worker"  # a training worker with --run-dir, and a standby worker (from the Trainer-level variant)
# Modules that import torch whatever they are given (their run then starts from the server's torch): the probes, and
# the export's converter (llama.cpp's convert_hf_to_gguf.py, ~30 a session: 2 s of torch import each) and its check.
BASE_MODULES = {"trainer.worker.probes.structure_probe", "trainer.worker.probes.grpocheck",
                "trainer.worker.probes.data_stats", "trainer.worker.probes.doctor_checks",
                "trainer.worker.export.verify", "trainer.worker.export.gguf_convert"}
CLI_COMMANDS = {"export-model", "chat"}  # the CLI commands that import torch
STARTED_AS_USUAL = {
    "trainer.worker.datapipe.producer": "the worker's tokenizing child: tokenizers and datasets, no torch",
    "trainer.worker.probes.memory_probe": "plan --measure: it measures on a GPU only",
    "trainer.worker.probes.simulate": "plan --simulate: one child per plan, its time is torch's fake tensors",
    "trainer.worker.probes.hubcheck": "preflight of a hub dataset: datasets, no torch",
    "trainer.worker.probes.reward_preview": "the wizard's reward preview: started by a few GUI tests only",
    "app.model.hub_download": "the GUI's model download: huggingface_hub, no torch",
}
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


def variant(module: str, args: list, env) -> "str | None":
    """Which pre-imported server a command starts from: "base" (torch), "trainer:LEFT,OUT" (a standby worker:
    transformers' Trainer with those libraries absent), or None (start as usual)."""
    if module in BASE_MODULES or (module == CLI and args[:1] and args[0] in CLI_COMMANDS):
        return "base"
    if module != WORKER or any(k in env for k in RANK_VARIABLES):  # launched ranks start as launched
        return None
    if args[:1] == ["--standby"]:
        without = ""
        for i, a in enumerate(args):
            if a == "--without" and i + 1 < len(args):
                without = args[i + 1]
            elif a.startswith("--without="):
                without = a.split("=", 1)[1]
        return "trainer:" + ",".join(sorted(n for n in without.split(",") if n))
    return "base" if "--run-dir" in args or any(a.startswith("--run-dir=") for a in args) else None


def _line(sock) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        more = sock.recv(256)
        if not more:
            return data
        data += more
    return data


def _shim() -> None:
    path = os.environ.get("TRAINPILOT_ZYGOTE_SOCKET")
    argv = getattr(sys, "orig_argv", None)
    if not path or os.environ.get("TRAINPILOT_TEST_ZYGOTE") == "0" or not argv or len(argv) < 3 or argv[1] != "-m":
        return
    module, args = argv[2], list(argv[3:])
    kind = variant(module, args, os.environ)
    if kind is None or not os.path.exists(path):
        return
    import json
    import signal
    import socket
    import struct

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        body = json.dumps({"module": module, "args": args, "orig_argv": list(argv), "cwd": os.getcwd(),
                           "env": dict(os.environ), "python": sys.executable,
                           "variant": "" if kind == "base" else kind}).encode("utf-8")
        socket.send_fds(sock, [struct.pack("!I", len(body)) + body], [0, 1, 2])
        reply = _line(sock)
    except OSError:
        sock.close()
        return
    if not reply.startswith(b"pid "):  # refused, or the server is gone: start as usual
        sock.close()
        return
    pid = int(reply[4:])

    def forward(sig, _frame):
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    devnull = os.open(os.devnull, os.O_RDWR)  # the fork holds the pipes now: their ends close when it ends
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    status = _line(sock)
    if status.startswith(b"exit "):
        os._exit(int(status[5:]))
    if status.startswith(b"signal "):
        sig = int(status[7:])
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(1)  # the server died under the fork: nothing says how it ended


def _next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            with open(candidate, encoding="utf-8") as f:
                exec(compile(f.read(), candidate, "exec"), {"__name__": "sitecustomize", "__file__": candidate})
            return


_next_sitecustomize()
_shim()
