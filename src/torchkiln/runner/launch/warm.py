"""Trial processes that start warm: forked from a server that imported torch once.

A fresh ``python`` for each trial spends seconds importing torch before it measures anything.
Inside ``scoped()`` (a tune, a bench) one server (warm_server.py) imports it once and forks
each trial's worker on request; the child is what the spawned worker would be (its own
session, the same files and environment, the same result file), and the caller watches it
through ``WarmProcess``, which answers as a ``Popen`` does, so timeouts, kills and exit codes
are handled as for a spawned trial. Where the server cannot start, dies, or the trial's
environment differs from the server's in what torch reads at import, the trial is spawned
cold, and its result says why (``start_reason``). ``KILN_WARM_START=0`` turns it off."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from torchkiln.runner.launch import spawn
from torchkiln.runner.launch.orphan import launcher_env

WARM_ENV = "KILN_WARM_START"
WORKER = "torchkiln.runner.protocol.worker"
SERVER_MODULE = "torchkiln.runner.launch.warm_server"
# The server imports torch (seconds; more on a busy host) before it listens.
READY_TIMEOUT_S = 120.0
# Servers one scope starts at most, one per import-time environment its trials ask for.
MAX_SERVERS = 3
# Variables a trial may set differently from the server: read after the fork, not at import
# (compile caches, the device a first CUDA call picks, kiln's own).
PER_TRIAL = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "CUDA_VISIBLE_DEVICES")
PER_TRIAL_PREFIXES = ("KILN_", "PYTHONPATH", "PYTHONUNBUFFERED")
# Read by torch, its threading libraries or the interpreter when they load: a trial that sets
# these differently than the server did would not see them in a fork.
AT_IMPORT_PREFIXES = ("TORCH", "PYTORCH", "TRITON", "CUDA", "OMP_", "MKL_", "KMP_", "PYTHON", "LD_")


@dataclass(frozen=True)
class Start:
    """How a trial process started: "warm" (forked) or "cold" (spawned), and why it was cold."""

    how: str
    reason: str | None = None


class WarmProcess:
    """A forked trial, watched as a ``Popen``: ``pid``, ``returncode``, ``poll``, ``wait``.
    Its exit code comes from the server, which is its parent."""

    def __init__(self, conn: socket.socket, pid: int, args: list[str]) -> None:
        self.conn, self.pid, self.args = conn, pid, args
        self.returncode: int | None = None
        self.lost: str | None = None  # set when the server went away before the child's exit
        self._buf = b""
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        self._read(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._read(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self.returncode

    def _read(self, timeout: float | None) -> None:
        with self._lock:
            if self.returncode is not None:
                return
            deadline = None if timeout is None else time.monotonic() + timeout
            while b"\n" not in self._buf:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                self.conn.settimeout(left if left is None or left > 0 else 0.0)
                try:
                    chunk = self.conn.recv(4096)
                except (BlockingIOError, TimeoutError):
                    return
                if not chunk:
                    if self._buf.strip():
                        break  # the exit message is the last line, its newline optional
                    self._server_gone()
                    return
                self._buf += chunk
            self.returncode = int(json.loads(self._buf.split(b"\n", 1)[0])["code"])
            self.conn.close()

    def _server_gone(self) -> None:
        # Its child notices the server gone and ends itself (orphan.py); make sure of it.
        self.lost = "the warm-start server exited while the trial ran"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.returncode = -signal.SIGKILL
        self.conn.close()


class WarmServer:
    """One server process and its socket; ``close`` ends it and its directory."""

    def __init__(self, like: Mapping[str, str] | None = None) -> None:
        """``like``: a trial's environment, whose variables read at import the server takes
        (by default this process's)."""
        self.dir = Path(tempfile.mkdtemp(prefix="kiln-warm-"))
        self.path = str(self.dir / "socket")
        self.log = self.dir / "server.log"
        env = dict(os.environ)
        if like is not None:
            env = {k: v for k, v in env.items() if not _at_import(k)}
            env.update({k: v for k, v in like.items() if _at_import(k)})
        self.env = launcher_env(dict(env, PYTHONUNBUFFERED="1"))
        with open(self.log, "wb") as log:
            self.proc = spawn.start(
                [sys.executable, "-m", SERVER_MODULE, self.path],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._ready: bool | None = None
        self.failure: str | None = None
        self._lock = threading.Lock()

    def _gone(self) -> str:
        tail = self.log.read_text(errors="replace")[-600:].strip() if self.log.exists() else ""
        why = f"the warm-start server exited (code {self.proc.poll()})"
        return f"{why}: {tail}" if tail else why

    def _connect(self) -> socket.socket:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.path)
        except OSError:
            conn.close()
            raise
        return conn

    def ready(self) -> str | None:
        """None once the server listens; else why it cannot serve (and it never will)."""
        with self._lock:
            if self.failure is None and self.proc.poll() is not None:
                self.failure = self._gone()
            if self._ready or self.failure:
                return self.failure
            deadline = time.monotonic() + READY_TIMEOUT_S
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    self.failure = self._gone()
                    return self.failure
                try:
                    self._connect().close()
                    self._ready = True
                    return None
                except OSError:
                    time.sleep(0.05)
            self.failure = f"the warm-start server was not ready after {READY_TIMEOUT_S:.0f} s"
            return self.failure

    def differs(self, env: Mapping[str, str]) -> list[str]:
        """What the trial's environment sets differently from the server's, among the variables
        read at import."""
        keys = set(env) | set(self.env)
        return sorted(k for k in keys if _at_import(k) and env.get(k) != self.env.get(k))

    def launch(
        self, argv: list[str], env: Mapping[str, str], stdout: str, stderr: str
    ) -> WarmProcess:
        """Forks the worker with ``argv``; OSError when the server cannot be reached."""
        conn = self._connect()
        try:
            request = {"argv": argv, "env": dict(env), "stdout": stdout, "stderr": stderr}
            ahead = prebuild_request(argv)
            if ahead is not None:
                request["prebuild"] = ahead
            conn.sendall(json.dumps(request).encode() + b"\n")
            line = b""
            while b"\n" not in line:
                chunk = conn.recv(4096)
                if not chunk:
                    raise OSError("the warm-start server closed the connection")
                line += chunk
            first, rest = line.split(b"\n", 1)
            proc = WarmProcess(conn, int(json.loads(first)["pid"]), argv)
            proc._buf = rest
            return proc
        except BaseException:
            conn.close()
            raise

    def close(self) -> None:
        spawn.end_group(self.proc, grace_s=2.0)
        shutil.rmtree(self.dir, ignore_errors=True)


def _at_import(key: str) -> bool:
    """A variable read when torch, its threading libraries or the interpreter load, which a
    trial cannot set differently from the server it is forked from."""
    return (
        key.startswith(AT_IMPORT_PREFIXES)
        and key not in PER_TRIAL
        and not key.startswith(PER_TRIAL_PREFIXES)
    )


def prebuild_request(argv: list[str]) -> dict[str, Any] | None:
    """What the server builds ahead for a trial (warm_server.prebuild): a built-in workload's
    spec fields, read from the trial's spec file (argv: MODE SPEC RESULT PHASE). A workload
    from a user's file is never built in the server: its factory may touch CUDA, and a server
    that had would fork children that cannot use it. An inference tune's preflight asks for the
    same build its trials will (it runs a forward, so builds for inference): the workload is
    then built once for the tune, not once more before the baseline starts."""
    if len(argv) < 2 or argv[0] not in ("trial", "preflight"):
        return None
    import torchkiln.workloads  # noqa: F401  (registers the built-ins)
    from torchkiln.workloads.base import registry

    try:
        spec = json.loads(Path(argv[1]).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(spec, dict) or spec.get("workload") not in registry():
        return None
    fields = ("workload", "preset", "batch_size", "step", "seed")
    if any(f not in spec for f in fields):
        return None
    if argv[0] == "preflight" and spec["step"] != "infer":
        return None  # it builds for inference, the trials for training: no build to share
    return {f: spec[f] for f in fields}


class _Scope:
    """The servers of the outermost ``scoped()``: the first started by its first trial (a tune
    whose trials are all reused, or run in process, starts none), another for a trial whose
    variables read at import differ from every running server's. That happens within one tune:
    on an H200 host a library imported by kiln's own process set KMP_DUPLICATE_LIB_OK and
    KMP_INIT_AT_FORK after the first trial started, and every later trial of that tune started
    cold (the trials' environments are copies of the process's). At most MAX_SERVERS."""

    def __init__(self) -> None:
        self.servers: list[WarmServer] = []
        self.lock = threading.Lock()

    def get(self, env: Mapping[str, str] | None = None) -> WarmServer:
        """A server whose import-time environment is ``env``'s; a new one while there are
        fewer than MAX_SERVERS, else the newest (whose differences the caller reports)."""
        with self.lock:
            for server in self.servers:
                if env is None or not server.differs(env):
                    return server
            if len(self.servers) < MAX_SERVERS:
                self.servers.append(WarmServer(env))
            return self.servers[-1]

    @property
    def server(self) -> WarmServer | None:
        return self.servers[0] if self.servers else None

    def close(self) -> None:
        with self.lock:
            for server in self.servers:
                server.close()


_active: _Scope | None = None
_active_lock = threading.Lock()


def enabled() -> bool:
    return os.environ.get(WARM_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


@contextlib.contextmanager
def scoped() -> Iterator[None]:
    """Trials started inside start warm from one server, ended on the way out (a Ctrl-C
    included). Nested scopes share the outer one's server. Also a decorator: ``@scoped()``."""
    global _active
    with _active_lock:
        outer = _active is None
        if outer:
            _active = _Scope()
        scope = _active
    try:
        yield
    finally:
        if outer:
            with _active_lock:
                _active = None
            scope.close()


def start_worker(
    argv: list[str], *, env: Mapping[str, str], stdout: IO[Any], stderr: IO[Any]
) -> tuple[subprocess.Popen | WarmProcess, Start]:
    """The worker ``python -m torchkiln.runner.protocol.worker ARGV``: forked from the scope's
    server where it can be, else spawned; ``stdout``/``stderr`` are open files (by name)."""
    server, reason = _server(env)
    if server is not None:
        try:
            return server.launch(argv, env, stdout.name, stderr.name), Start("warm")
        except OSError as exc:
            reason = server._gone() if server.proc.poll() is not None else str(exc)
            server.failure = server.failure or reason
    cmd = [sys.executable, "-m", WORKER, *argv]
    return spawn.start(cmd, env=env, stdout=stdout, stderr=stderr), Start("cold", reason)


def _server(env: Mapping[str, str]) -> tuple[WarmServer | None, str | None]:
    """The server to fork this trial from, or None and why it starts cold."""
    if not enabled():
        return None, f"{WARM_ENV}={os.environ.get(WARM_ENV)}"
    scope = _active
    if scope is None:
        return None, "no warm-start server in this process (one serves a tune or bench)"
    server = scope.get(env)
    failure = server.ready()
    if failure:
        return None, failure
    differs = server.differs(env)
    if differs:
        why = f"its environment sets {', '.join(differs)} differently from the warm-start server"
        return None, why
    return server, None
