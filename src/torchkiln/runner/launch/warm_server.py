"""The warm-start server: ``python -m torchkiln.runner.launch.warm_server SOCKET``.

Imports torch and the trial worker once, never touching CUDA (a forked child could not use a
CUDA context its parent made), then forks one child per request on SOCKET. The child becomes
what ``python -m torchkiln.runner.protocol.worker ARGS`` would be: a session of its own, stdin
from /dev/null, stdout and stderr appended to the files named, the environment given (its
compile cache directories included: nothing has compiled yet), then the worker's ``main``.

One request per connection, a JSON line ``{"argv", "env", "cwd", "stdout", "stderr"}`` and, for
a trial of a built-in workload, ``"prebuild"`` (its spec's workload, preset, batch size, step
and seed: built once here, before the fork, see ``prebuild``); the server answers ``{"pid"}`` at
once, then ``{"code"}`` (as ``Popen.returncode``: negative for a signal) when the child exits.
Single-threaded on purpose: a fork copies only the thread that calls it, and a lock another
thread held would stay held in the child forever."""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import sys
import traceback
from typing import Any

POLL_S = 0.05
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
# Workloads this server has built (or tried to): each is built once, before the first fork.
_prebuilt: set[tuple] = set()


def prebuild(p: dict[str, Any]) -> None:
    """Build a built-in workload once, on the host, so that every trial forked after it copies
    that build instead of importing its libraries and building it again (workload_copies.py).
    On one thread: a process that forks must not have started OpenMP's worker threads, which a
    child would find missing. A failure is left to the trial, which builds the workload itself
    and reports it."""
    key = (p["workload"], p["preset"], p["batch_size"], p["step"], p["seed"])
    if key in _prebuilt:
        return
    _prebuilt.add(key)
    import torch

    from torchkiln.runner.protocol import workload_copies
    from torchkiln.runner.protocol.settings import seed_everything
    from torchkiln.workloads import load_workload

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        workload_copies.activate()
        seed_everything(p["seed"])
        workload_copies.load(
            key,
            lambda: load_workload(
                p["workload"], preset=p["preset"], batch_size=p["batch_size"], step=p["step"]
            ),
        )
    except Exception:  # noqa: BLE001  (the trial builds it and reports what fails)
        print(f"building {key} ahead failed; its trials build it themselves", flush=True)
        traceback.print_exc()
    finally:
        torch.set_num_threads(threads)
    if torch.cuda.is_initialized() or not forks_can_use_cuda():
        # A fork of this process could not use CUDA: serve no more (trials then start cold).
        print(f"building {key} initialised or counted CUDA: the server stops", flush=True)
        sys.exit(3)


def _run_child(request: dict[str, Any], keep: list[socket.socket]) -> None:
    """In the forked child: become the worker process, run it, exit. Never returns."""
    code = 1
    try:
        os.setsid()  # its own group: a timeout's killpg reaches it and its compile workers
        for s in keep:
            s.close()
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(request["stdout"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        err = os.open(request["stderr"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        for fd, target in ((null, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        # What the fresh interpreter would have put on sys.path from the trial's PYTHONPATH.
        extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:0] = [p for p in extra if p not in sys.path]
        if request.get("cwd"):
            os.chdir(request["cwd"])
        from torchkiln.runner.protocol import worker

        sys.argv = [worker.__file__, *request["argv"]]
        worker.exit_with_launcher()
        try:
            code = worker.main(list(request["argv"]))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001  (the child's own failure: its stderr and exit code say it)
        traceback.print_exc()
        code = 1
    finally:
        try:
            import atexit

            atexit._run_exitfuncs()  # what an interpreter's normal exit would run
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(path: str) -> None:
    from torchkiln.runner.launch.orphan import LAUNCHER_ENV, end_self, launcher_gone

    # A server that outlives its kiln ends itself (its children notice it gone and follow).
    # Checked here rather than in a watcher thread: this process forks, and stays one thread.
    named = os.environ.get(LAUNCHER_ENV)
    launcher, parent = (int(named) if named else None), os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    pending: dict[socket.socket, bytes] = {}  # connections whose request line is not in yet
    children: dict[int, socket.socket] = {}
    while True:
        if launcher_gone(launcher, parent):
            end_self()
        for key, _ in sel.select(timeout=POLL_S):
            sock = key.fileobj
            if sock is listener:
                conn, _ = listener.accept()
                pending[conn] = b""
                sel.register(conn, selectors.EVENT_READ)
                continue
            assert isinstance(sock, socket.socket)
            chunk = sock.recv(1 << 16)
            if not chunk:  # the caller went away (before its request, or after it was sent)
                sel.unregister(sock)
                pending.pop(sock, None)
                sock.close()
                continue
            if sock not in pending:
                continue  # nothing more is expected on a connection whose child runs
            pending[sock] += chunk
            if b"\n" not in pending[sock]:
                continue
            request = json.loads(pending.pop(sock).split(b"\n", 1)[0])
            if request.get("prebuild"):
                prebuild(request["prebuild"])
            pid = os.fork()
            if pid == 0:
                _run_child(request, [listener, *pending, *children.values(), sock])
            children[pid] = sock
            sock.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            sock = children.pop(pid, None)
            if sock is None:
                continue
            try:
                sock.sendall(json.dumps({"code": os.waitstatus_to_exitcode(status)}).encode())
            except OSError:
                pass  # the caller had gone: nobody is left to tell
            if sock.fileno() != -1:
                sel.unregister(sock)
                sock.close()


def forks_are_marked() -> bool:
    """Whether a child forked now is marked unable to initialise CUDA: torch marks the children
    of a process that has counted its devices through the CUDA runtime (torch.cuda.is_available,
    device_count). Asked of a real child, so that whatever version of torch or of a library did
    the counting, the server finds out before it forks a trial."""
    import torch

    pid = os.fork()
    if pid == 0:
        os._exit(1 if torch.cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) != 0


def forks_can_use_cuda() -> bool:
    """Whether a child forked now can use CUDA as well as this process could: its forks are not
    marked, or they are but the count found no device, so they lose nothing. The second is a
    host without a GPU driver under torch 2.11: the NVML check cannot start NVML there and falls
    back to counting through the runtime (on a 2-core CPU host every warm-start server stopped,
    and every trial started cold). Counting again here marks nothing more: the forks already are."""
    if not forks_are_marked():
        return True
    import torch

    return torch.cuda.device_count() == 0


def preload():
    """What every trial imports before it measures; CUDA stays uninitialised (torch.cuda is
    lazy: nothing here asks for a device or counts devices), and no thread or process starts.
    Inductor's modules too: a compiled trial's first ``torch.compile()`` call imported about 600
    modules, 1.0 s on a 2-core CPU host and 3-5 s of an H200 host's trials' `build` phase with
    four trials in flight.

    Some imports ask whether CUDA is there: torch 2.11's Inductor benchmarking module does, at
    import, with `torch.cuda.is_available()`, whose default check (cudaGetDeviceCount) leaves
    every later fork unable to use CUDA (on an H200 host every trial then started cold). Asked
    through NVML, torch's fork-safe check, the answer is the same. It is set in this server's
    environment only: a forked trial runs with the environment its request gives."""
    os.environ.setdefault(NVML_CHECK, "1")
    import torch
    import torch._dynamo.utils  # noqa: F401  (every trial reads its counters)
    import torch._inductor.compile_fx  # noqa: F401

    import torchkiln.runner.protocol.measure_trial  # noqa: F401
    import torchkiln.runner.protocol.worker  # noqa: F401
    from torchkiln.measure import environment

    environment.warm()
    return torch


def main(argv: list[str]) -> int:
    (path,) = argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # kiln ends it; a terminal's Ctrl-C does not
    torch = preload()
    if not forks_can_use_cuda():
        print("a process forked after these imports could not use CUDA (something counted the "
              "devices): the server stops")  # fmt: skip
        return 2
    if torch.cuda.is_initialized():
        print("CUDA was initialised by the imports: a forked trial could not use it")
        return 2
    serve(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
