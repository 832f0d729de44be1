"""Two route processes' steady steps timed rep by rep, each process still alive.

A route's steady step is only comparable with the cold compile's when both are timed under the
same conditions, and a process timed after another is not: on an H100 host, bert-base training
under reduce-overhead + bf16 ran its steady step at 5.57, 5.55 and 6.65 ms in three cold-compile
processes and 5.77, 6.87 and 7.38 ms in three compile-cache processes started between them
(the same kernels; `benchmarks/results/ship/h100/ship-bert-train-rounds.json`), a drift of 20%
over the run against a goal of 2%. So each process, once it has measured what is its own (load,
first call, early calls, its own steady reps), connects to the parent and waits; the parent then
asks them in turn for one timed rep each (cold, route, route, cold, ...), as a trial interleaves
its arms, and the route's step over cold's is the median of each pair's ratio, with its
interval. Only one process runs at a time; the other waits on its socket.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchkiln.measure.stats import paired_speedup

PAIRED_REPS = 20
# Seconds one rep may take before the pairing gives up on the process (a rep is ~0.1 s).
REP_TIMEOUT_S = 60.0


class Listener:
    """A Unix socket the route processes connect to once ready (its path kept short: the
    system's limit is about 100 bytes, and run directories may be deep)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="kiln-pair-"))
        self.address = str(self.dir / "s")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.address)
        self.sock.listen(4)

    def accept(self, proc: subprocess.Popen, timeout_s: float) -> Any | None:
        """The connection of ``proc`` once it is ready; None when it exits or ``timeout_s``
        passes first (its result then says why)."""
        deadline = time.monotonic() + timeout_s
        self.sock.settimeout(0.5)
        while time.monotonic() < deadline:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                if proc.poll() is not None:
                    return None
                continue
            conn.settimeout(REP_TIMEOUT_S)
            return conn.makefile("rwb")
        return None

    def close(self) -> None:
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def rep(stream: Any) -> float:
    """One timed rep of the process behind ``stream``: its milliseconds per step."""
    stream.write(b"rep\n")
    stream.flush()
    line = stream.readline()
    if not line:
        raise ConnectionError("the process closed its end before answering")
    return float(line)


def release(stream: Any | None) -> None:
    """Tells the process it may finish (it writes its result and exits)."""
    if stream is None:
        return
    try:
        stream.write(b"exit\n")
        stream.flush()
        stream.close()
    except OSError:
        stream.close()


def paired_reps(
    cold: Any, route: Any, reps: int = PAIRED_REPS, timed: Callable[[Any], float] = rep
) -> dict[str, Any]:
    """``reps`` timed reps of each process, the order alternating (cold first on even reps):
    `route_over_cold`, the median of each pair's route / cold ratio, its bootstrap `ci95`, and
    each process's `*_ms` samples; or the `error` that stopped them."""
    cold_ms: list[float] = []
    route_ms: list[float] = []
    try:
        for i in range(reps):
            order = ((cold, cold_ms), (route, route_ms))
            for stream, into in order if i % 2 == 0 else order[::-1]:
                into.append(timed(stream))
    except (OSError, ValueError, ConnectionError) as e:
        return {"error": f"{type(e).__name__}: {e}", "cold_ms": cold_ms, "route_ms": route_ms}
    ratio = paired_speedup(route_ms, cold_ms)
    return {
        "reps": reps,
        "route_over_cold": ratio.median,
        "ci95": list(ratio.ci95),
        "cold_ms": cold_ms,
        "route_ms": route_ms,
    }
