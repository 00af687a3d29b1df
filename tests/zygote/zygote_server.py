"""The test session's pre-imported interpreter (a "zygote"): heavy TrainPilot children start by fork, not import.

Every training worker, structure probe, export check… of the suite is a new ``python -m trainer…`` that spends ~5 s
of CPU importing torch and transformers before it does anything: on the 2-core development machine ~40% of the
suite's CPU (issue 29, ``tools/suite_cpu.py``). With ``tests/zygote`` on ``PYTHONPATH`` (``tests/plugins/zygote.py``
sets it up per xdist worker), such a child's ``sitecustomize`` (the shim, ``sitecustomize.py`` here) hands its command line,
working folder, environment and its stdin/stdout/stderr to this server, which forks a copy of itself that already
imported torch (for a standby worker: also transformers' Trainer, with the libraries that worker leaves out marked
absent first, exactly as the worker does) and runs the module there with ``runpy`` as ``python -m`` would. The shim
stays the process its parent started: it forwards signals to the fork and ends as the fork ended (its exit code, or
the signal that killed it); when the shim is killed, the server kills the fork's process group.

Only exact ``python -m MODULE ARGS`` command lines of the modules ``sitecustomize.variant`` names, with this
interpreter, and an environment whose every variable that counts (``Recorder.counts``: what the server's imports
read, and what C libraries read as they load) is the server's, are forked; anything else starts as usual. No
TrainPilot module but the package itself (its environment defaults) is imported here: each child imports them
itself, reading its own environment.
``TRAINPILOT_TEST_ZYGOTE=0`` turns it off for a run (every child then starts as the user's would).

    python tests/zygote/zygote_server.py SOCKET_PATH [LOG]
"""
from __future__ import annotations

import gc
import json
import os
import selectors
import signal
import socket
import struct
import sys
import threading
import time

# Which variables decide whether a child may start from this server: those the server's imports read in Python
# (recorded while importing: ``Recorder``), those C libraries read as they load (the interpreter, glibc, OpenMP,
# BLAS, torch's C++), and the prefixes a library scanned for (tqdm's TQDM_, fsspec's FSSPEC_, networkx's
# NETWORKX_). A scan by anything else makes every variable count. Never counted: what each fork sets up as asked
# (stream buffering, sys.path) and what is read only when CUDA or inductor is first used.
C_PREFIXES = ("PYTHON", "LD_", "LC_", "MALLOC_", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS", "BLIS_", "VECLIB_",
              "NUMEXPR_", "TORCH", "PYTORCH", "CUDA", "CUBLAS", "NCCL_", "NVIDIA_", "ARROW_", "JE_")
C_NAMES = {"LANG", "LANGUAGE", "TZ", "HOME", "TMPDIR", "TEMP", "TMP", "PATH"}
SCANS = {"tqdm/utils.py": "TQDM_", "fsspec/config.py": "FSSPEC_",  # os.environ iterated at import, for a prefix
         "networkx/utils/backends.py": "NETWORKX_"}
NEVER = {"PYTHONUNBUFFERED", "PYTHONPATH", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "CUDA_VISIBLE_DEVICES",
         "PYTORCH_NVML_BASED_CUDA_CHECK", "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"}
MAX_SUBS = 4  # pre-imported Trainer variants (one per set of libraries left out) per server
LOG = [None]
SERVER_PYTHONPATH = [os.environ.get("PYTHONPATH", "")]


def log(**rec) -> None:
    if LOG[0]:
        with open(LOG[0], "a", encoding="utf-8") as f:
            f.write(json.dumps({"t": round(time.time(), 3), "server": os.getpid(), **rec}) + "\n")


class Recorder:
    """While importing: which variables Python code reads from ``os.environ`` (a lookup, ``get``, ``in``), and which
    prefixes it scans for (an iteration from a known ``SCANS`` file; any other iteration sets ``everything``)."""

    def __init__(self):
        self.read: set[str] = set()
        self.prefixes: set[str] = set()
        self.everything = False

    def __enter__(self):
        cls = type(os.environ)
        self._saved = cls.__getitem__, cls.__iter__
        getitem, iterate = self._saved
        recorder = self

        def __getitem__(env, key):
            caller = sys._getframe(1).f_code
            if not (caller.co_name == "__iter__" and _stdlib(caller.co_filename, "_collections_abc")):
                recorder.read.add(key)  # a view's iteration reads every key: that is the scan, recorded below
            return getitem(env, key)

        def __iter__(env):
            frame = sys._getframe(1)
            while frame is not None and (_stdlib(frame.f_code.co_filename, "_collections_abc")
                                         or _stdlib(frame.f_code.co_filename, "os")):
                frame = frame.f_back
            where = frame.f_code.co_filename.replace(os.sep, "/") if frame is not None else "?"
            scan = next((prefix for tail, prefix in SCANS.items() if where.endswith(tail)), None)
            if scan is None:
                recorder.everything = True
                log(event="environment scanned", where=where)
            else:
                recorder.prefixes.add(scan)
            return iterate(env)
        cls.__getitem__, cls.__iter__ = __getitem__, __iter__
        return self

    def __exit__(self, *exc):
        cls = type(os.environ)
        cls.__getitem__, cls.__iter__ = self._saved

    def merge(self, other: "Recorder") -> None:
        self.read |= other.read
        self.prefixes |= other.prefixes
        self.everything = self.everything or other.everything

    def counts(self, name: str) -> bool:
        """Whether ``name``'s value must be the server's for a child to start from it."""
        if name in NEVER:
            return False
        return (self.everything or name in self.read or name in C_NAMES
                or name.startswith(C_PREFIXES + tuple(self.prefixes)))


def _stdlib(filename: str, module: str) -> bool:
    """Whether code of ``filename`` is the standard library's ``module`` (frozen, or from its .py)."""
    return filename == f"<frozen {module}>" or filename.replace(os.sep, "/").endswith(f"/{module}.py")


def env_differs(env: dict, base: dict, recorder: Recorder) -> list[str]:
    """The variables that count (``Recorder.counts``) whose values differ between a child's environment and the
    server's. PYTHONPATH may differ where its other folders hold none of the packages this server imported (the
    fork's ``sys.path`` is then made as that PYTHONPATH makes it)."""
    keys = set(env) | set(base)
    differs = sorted(k for k in keys if recorder.counts(k) and env.get(k) != base.get(k))
    if env.get("PYTHONPATH") != base.get("PYTHONPATH") and not _pythonpath_ok(env.get("PYTHONPATH", ""),
                                                                               base.get("PYTHONPATH", "")):
        differs.append("PYTHONPATH")
    return differs


def normalized(env: dict, delta: dict) -> dict:
    """A child's environment as it is once it imported what this server did: the variables those imports set
    where they were unset (``trainer/__init__``'s HF_HUB_DISABLE_TELEMETRY, torch's TORCHINDUCTOR_CACHE_DIR)."""
    return {**delta, **env}


def _entries(pythonpath: str) -> list[str]:
    return [p for p in pythonpath.split(os.pathsep) if p]


def _pythonpath_ok(theirs: str, mine: str) -> bool:
    loaded = {name.split(".")[0] for name in sys.modules}
    for entry in set(_entries(theirs)) - set(_entries(mine)):
        try:
            names = {n[:-3] if n.endswith(".py") else n for n in os.listdir(entry)}
        except OSError:
            continue
        if names & loaded:
            return False
    return True


def child_sys_path(cwd: str, theirs: str, mine: str) -> list[str]:
    """``sys.path`` as ``python -m`` in ``cwd`` with PYTHONPATH ``theirs`` makes it, from this server's (made with
    ``mine``): the folder, their PYTHONPATH folders, then the interpreter's own."""
    own = [p for p in sys.path[1:] if p not in set(_entries(mine))]
    return [cwd, *_entries(theirs), *own]


def recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    """One request: a 4-byte length, that many bytes of JSON, and the child's file descriptors (SCM_RIGHTS)."""
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 8)
    if len(data) < 4:
        raise ConnectionError("short request")
    size = struct.unpack("!I", data[:4])[0]
    body = data[4:]
    while len(body) < size:
        more = conn.recv(size - len(body))
        if not more:
            raise ConnectionError("request cut off")
        body += more
    return json.loads(body.decode("utf-8")), list(fds)


def pack(req: dict) -> bytes:
    body = json.dumps(req).encode("utf-8")
    return struct.pack("!I", len(body)) + body


def preload_torch() -> None:
    """What every heavy child imports first, none of it reading TrainPilot's variables: torch and the parts of it
    that transformers' model loading imports (DTensor, dynamo, sympy)."""
    import numpy  # noqa: F401
    import safetensors.torch  # noqa: F401
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401
    import torch.distributed.tensor  # noqa: F401


def preload_trainer(without: list[str]) -> None:
    """What a standby worker imports before it reads its arguments (``trainer.worker.train.recipe.standby``), with
    the libraries it leaves out marked absent first (``trainer.worker.loading.lean``: a ``None`` in sys.modules)."""
    for name in without:
        if name and name not in sys.modules:
            sys.modules[name] = None
    import transformers  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments  # noqa: F401


class Server:
    """One pre-imported interpreter serving forks: requests come from ``accept`` (the base) or a control socket
    (a variant the base handed them to)."""

    def __init__(self, listener: socket.socket | None, control: socket.socket | None, parent_pid: int):
        self.sel = selectors.DefaultSelector()
        self.listener = listener
        self.children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, shim connection)
        self.conns: dict[int, int] = {}  # shim connection fd -> pidfd
        self.subs: dict[str, socket.socket] = {}  # variant key -> control socket (base only)
        self.env = dict(os.environ)
        self.env_delta: dict[str, str] = {}  # what the preload imports set in os.environ (re-applied in each fork)
        self.recorder = Recorder()  # what those imports read
        if listener is not None:
            self._watch(listener, "accept")
        if control is not None:
            self._watch(control, "handoff")
        parent = os.pidfd_open(parent_pid)
        self.sel.register(parent, selectors.EVENT_READ, ("parent", None))

    def _watch(self, sock: socket.socket, what: str, extra=None) -> None:
        self.sel.register(sock, selectors.EVENT_READ, (what, extra))

    def _unwatch(self, sock) -> None:
        try:
            self.sel.unregister(sock)
        except (KeyError, ValueError):
            pass

    def preloaded(self, before: dict, recorder: Recorder) -> None:
        """The imports are done (``recorder`` saw what they read): what they set in os.environ is what a child's own
        imports would set where its environment does not (``normalized``)."""
        self.recorder.merge(recorder)
        self.env = dict(os.environ)
        self.env_delta = {k: v for k, v in os.environ.items() if before.get(k) != v}
        gc.collect()
        gc.freeze()  # the forks share these pages: no collection touches them
        sys.stdout.flush()
        sys.stderr.flush()

    def serve(self) -> None:
        while True:
            for key, _mask in self.sel.select():
                what, extra = key.data
                if what == "accept":
                    self._accept()
                elif what == "handoff":
                    self._handoff(key.fileobj)
                elif what == "conn":
                    self._conn_readable(key.fileobj)
                elif what == "child":
                    self._reap(key.fd)
                elif what == "sub":
                    self._sub_readable(extra, key.fileobj)
                elif what == "parent":
                    self._exit()

    # the base: a shim connects --------------------------------------------------------------------------------
    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        try:
            req, fds = recv_request(conn)
        except (OSError, ValueError, ConnectionError):
            conn.close()
            return
        differs = self._differs(req)
        if differs:
            log(decision="no", module=req.get("module"), differs=differs[:5])
            self._refuse(conn, fds)
            return
        variant = req.get("variant") or ""
        if variant.startswith("trainer:"):
            sub = self._sub(variant)
            if sub is not None:
                self._pass_on(sub, req, conn, fds)
                return
        log(decision="base", module=req["module"])
        self._fork(req, conn, fds)

    def _differs(self, req: dict) -> list[str]:
        """What keeps this server from standing for the child's own start: another interpreter, or the variables
        that count whose values are not the server's (none: it can)."""
        req["env"] = normalized(req["env"], self.env_delta)
        return env_differs(req["env"], self.env, self.recorder) if req.get("python") == sys.executable else ["python"]

    def _pass_on(self, to: socket.socket, req: dict, conn: socket.socket, fds: list[int]) -> None:
        """Hand a shim (its connection and descriptors) to the other server on ``to``: base to variant, or a variant
        back to the base. This one keeps no copy; when the other is gone, the shim starts as usual."""
        try:
            socket.send_fds(to, [pack(req)], [conn.fileno(), *fds])
        except OSError:
            self._refuse(conn, fds)
            return
        conn.close()
        for fd in fds:
            os.close(fd)

    def _refuse(self, conn: socket.socket, fds: list[int]) -> None:
        for fd in fds:
            os.close(fd)
        try:
            conn.sendall(b"no\n")
        except OSError:
            pass
        conn.close()

    def _sub(self, variant: str) -> socket.socket | None:
        """The variant server for ``variant`` ("trainer:" + the libraries left out), started on first use."""
        if variant in self.subs:
            return self.subs[variant]
        if len(self.subs) >= MAX_SUBS:
            return None
        # packets: requests queued while the variant imports arrive one by one, each with its own descriptors
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:  # the variant: drop the base's descriptors, import, serve handoffs
            try:
                mine.close()
                _close_all_but(theirs.fileno())  # the base's sockets, and the request being served now
                parent = os.getppid()
                sub = Server(None, theirs, parent)
                before = dict(os.environ)
                with Recorder() as recorder:
                    preload_trainer(variant.split(":", 1)[1].split(","))
                recorder.merge(self.recorder)
                sub.preloaded(before, recorder)
                sub.env_delta.update(self.env_delta)
                log(event="variant ready", variant=variant)
                sub.serve()
            finally:
                os._exit(0)
        theirs.close()
        self.subs[variant] = mine
        self._watch(mine, "sub", variant)
        return mine

    def _sub_readable(self, variant: str, sock) -> None:
        """A variant sent back a child it cannot stand for (its imports read a variable the child sets otherwise,
        say HF_DATASETS_CACHE): the base forks it, from torch; or the variant is gone."""
        try:
            req, fds = recv_request(sock)
        except (OSError, ValueError, ConnectionError):
            self._unwatch(sock)
            sock.close()
            self.subs.pop(variant, None)
            return
        log(decision="base", module=req["module"], variant=variant, not_variant=req.get("differs", [])[:5])
        self._fork(req, socket.socket(fileno=fds[0]), fds[1:])

    # a variant: the base hands a shim over ------------------------------------------------------------------------
    def _handoff(self, control) -> None:
        try:
            req, fds = recv_request(control)
        except (OSError, ValueError, ConnectionError):
            self._exit()
        conn = socket.socket(fileno=fds[0])
        differs = self._differs(req)
        if not differs:
            log(decision="variant", module=req["module"], variant=req.get("variant"))
            self._fork(req, conn, fds[1:])
            return
        req["differs"] = differs
        self._pass_on(control, req, conn, fds[1:])  # back to the base, which forks it from torch

    # both: fork, watch, report --------------------------------------------------------------------------------------
    def _fork(self, req: dict, conn: socket.socket, fds: list[int]) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            become(req, fds, conn.fileno(), self.env_delta)  # never returns
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = (pid, conn)
        self.conns[conn.fileno()] = pidfd
        self.sel.register(pidfd, selectors.EVENT_READ, ("child", None))
        self._watch(conn, "conn")
        try:
            conn.sendall(f"pid {pid}\n".encode())
        except OSError:
            pass  # the shim is gone: its connection reads as ended next

    def _conn_readable(self, conn) -> None:
        """A shim said nothing after its request: its connection ended (it was killed). Kill the fork's group."""
        try:
            data = conn.recv(64)
        except OSError:
            data = b""
        if data:
            return
        pidfd = self.conns.pop(conn.fileno(), None)
        self._unwatch(conn)
        if pidfd is not None and pidfd in self.children:
            pid, _ = self.children[pidfd]
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            log(event="shim gone, fork killed", pid=pid)
            self.children[pidfd] = (pid, None)
        conn.close()

    def _reap(self, pidfd: int) -> None:
        pid, conn = self.children.pop(pidfd)
        self.sel.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        if conn is None:
            return
        self.conns.pop(conn.fileno(), None)
        self._unwatch(conn)
        line = f"signal {os.WTERMSIG(status)}\n" if os.WIFSIGNALED(status) else \
            f"exit {os.waitstatus_to_exitcode(status)}\n"
        try:
            conn.sendall(line.encode())
        except OSError:
            pass
        conn.close()

    def _exit(self) -> None:
        os._exit(0)


def _close_all_but(*keep: int) -> None:
    """Close every descriptor above stderr but ``keep`` (the preloaded libraries hold none: checked)."""
    start = 3
    for fd in sorted(keep):
        os.closerange(start, fd)
        start = fd + 1
    os.closerange(start, os.sysconf("SC_OPEN_MAX"))


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def become(req: dict, fds: list[int], conn_fd: int, env_delta: dict) -> None:
    """In the fork: become ``python -m MODULE ARGS`` started by the shim (its descriptors, folder, environment,
    command line, signals), run it, and end as the interpreter would."""
    code = 1
    try:
        os.setsid()  # its own process group: the server kills it whole when the shim is killed
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
        _close_all_but()  # as Popen's close_fds: the server's sockets and the shim's connection are not its
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD,
                    signal.SIGALRM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(req["cwd"])
        env = normalized(req["env"], env_delta)
        os.environ.clear()
        os.environ.update(env)
        _std_streams(env)
        import importlib
        import runpy
        import types

        sys.argv = [req["orig_argv"][0], *req["args"]]
        sys.orig_argv = list(req["orig_argv"])
        sys.path[:] = child_sys_path(req["cwd"], env.get("PYTHONPATH", ""), SERVER_PYTHONPATH[0])
        importlib.invalidate_caches()
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            runpy._run_module_as_main(req["module"], alter_argv=True)
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc.code)
        except KeyboardInterrupt:
            sys.excepthook(*sys.exc_info())
            _finish(None)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        except BaseException:  # noqa: BLE001 - as the interpreter: print, exit 1
            sys.excepthook(*sys.exc_info())
            code = 1
    except BaseException:  # noqa: BLE001 - the fork must never return into the server's loop
        import traceback

        traceback.print_exc()
    _finish(code)


def _exit_code(value) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    try:
        print(value, file=sys.stderr)
    except Exception:  # noqa: BLE001
        pass
    return 1


def _std_streams(env: dict) -> None:
    """stdin/stdout/stderr on the shim's descriptors, made as the interpreter makes them (same encoding and error
    handler as this server's, which started with the same locale variables; unbuffered under PYTHONUNBUFFERED)."""
    import io

    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    made = []
    for fd, old in ((0, sys.__stdin__), (1, sys.__stdout__), (2, sys.__stderr__)):
        write = fd != 0
        if write:
            raw = io.FileIO(fd, "wb", closefd=False)
            buffer = raw if unbuffered else io.BufferedWriter(raw)
        else:
            buffer = io.BufferedReader(io.FileIO(fd, "rb", closefd=False))
        line_buffering = write and (fd == 2 or os.isatty(fd)) and not unbuffered
        made.append(io.TextIOWrapper(buffer, encoding=old.encoding, errors=old.errors, newline="\n",
                                     line_buffering=line_buffering, write_through=unbuffered and write))
    sys.stdin, sys.stdout, sys.stderr = made
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = made


def _finish(code) -> None:
    """The interpreter's own ending: wait for non-daemon threads, run atexit, flush, exit."""
    try:
        threading._shutdown()
    except Exception:  # noqa: BLE001
        pass
    try:
        import atexit

        atexit._run_exitfuncs()
    except Exception:  # noqa: BLE001
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    if code is not None:
        os._exit(code)


def main(argv: list[str]) -> int:
    path = argv[0]
    LOG[0] = argv[1] if len(argv) > 1 else None
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C in pytest's terminal: the session ends us
    parent = os.getppid()
    before = dict(os.environ)
    with Recorder() as recorder:
        import trainer  # noqa: F401 - the package's own environment defaults, set before anything reads them
        preload_torch()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = f"{path}.{os.getpid()}"
    listener.bind(tmp)
    listener.listen(64)
    server = Server(listener, None, parent)
    server.preloaded(before, recorder)
    os.replace(tmp, path)  # the socket appears only once the server answers: a shim before that starts as usual
    log(event="ready", preload_s=round(time.time() - T0, 2))
    try:
        server.serve()
    finally:
        _close_path(path)
    return 0


def _close_path(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


T0 = time.time()

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
