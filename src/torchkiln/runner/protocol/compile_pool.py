"""Inductor's compile workers at a lower CPU priority than the trial's own process, on request.

Trials on one GPU overlap: while some compile, others build their models, warm their baselines
and check their outputs, and each of those phases is host work that every neighbour's timed
reps wait for (host_lock.py). Inductor compiles in a pool of worker processes, one per core by
default, so four trials compiling at once put some sixty busy processes on sixteen cores, and a
neighbour's one-thread phases ran three to four times slower than alone (GPT-2 small on an H100
host, kiln 163c5d8: a model's build 0.7 s alone, 2.6-2.8 s beside the compiles).

With ``KILN_COMPILE_NICE=N`` a trial that compiles with Inductor starts the pool itself before
it builds anything and lowers the pool's process N nice levels below its own before the pool
starts its workers, which inherit it (and so do the compilers they run: ptxas, the C++
compiler). The trial's own process keeps its priority: unprivileged processes may lower a
priority but not raise it back. Off by default: in one 8-minute GPT-2 tune on an H100 host with
N=10 (then from a lowered thread) both max-autotune compiles ran far slower than in the same
tune without it (one past 300 s against 93 s), which no measurement has yet explained.
"""

from __future__ import annotations

import os
import sys
from typing import Any

NICE_ENV = "KILN_COMPILE_NICE"


def nice_steps() -> int:
    """The nice levels asked for in KILN_COMPILE_NICE (0, off, when unset)."""
    from torchkiln.errors import KilnUserError

    text = os.environ.get(NICE_ENV, "").strip()
    if not text:
        return 0
    try:
        steps = int(text)
    except ValueError:
        steps = -1
    if not 0 <= steps <= 19:
        raise KilnUserError(f"{NICE_ENV}={text!r}: expected a whole number from 0 to 19")
    return steps


def start_lowered(steps: int) -> dict[str, Any]:
    """Start Inductor's compile-worker pool (as ``torch.compile`` would on its first use) with
    its process ``steps`` nice levels below the caller's, before it starts its workers; returns
    ``started``, the pool's ``nice`` as read back from its process, or ``why`` not."""
    if not sys.platform.startswith("linux"):
        return {"started": False, "why": "per-process priority here is Linux's"}
    try:
        from torch._inductor import async_compile, config
    except ImportError as e:
        return {"started": False, "why": f"torch._inductor is not importable: {e}"}
    if config.worker_start_method != "subprocess":
        # A forked pool starts its workers from whichever thread submits first.
        return {"started": False, "why": f"the {config.worker_start_method!r} pool kind"}
    if os.environ.get("TORCH_WARM_POOL", "1") != "1" or async_compile.get_compile_threads() <= 1:
        return {"started": False, "why": "Inductor compiles in the calling process"}
    pools = async_compile.AsyncCompile
    info = getattr(pools.process_pool, "cache_info", None)
    if info is None:
        return {"started": False, "why": "this torch's pool cannot be told started or not"}
    if info().currsize:
        return {"started": False, "why": "the pool was already started", **_nice_of(pools)}
    # The sidecar process starts here; its workers only once woken (torch 2.11 to 2.14).
    pools.warm_pool()
    process = getattr(pools.process_pool(), "process", None)
    if process is None:
        return {"started": False, "why": "the pool has no process of its own"}
    try:
        os.setpriority(os.PRIO_PROCESS, process.pid, os.getpriority(os.PRIO_PROCESS, 0) + steps)
    except OSError as e:
        pools.wakeup()
        return {"started": True, "nice": None, "why": f"not lowered: {e}"}
    pools.wakeup()
    return {"started": True, **_nice_of(pools)}


def _nice_of(pools: Any) -> dict[str, Any]:
    try:
        return {"nice": os.getpriority(os.PRIO_PROCESS, pools.process_pool().process.pid)}
    except (AttributeError, OSError) as e:
        return {"nice": None, "why": f"the pool's priority cannot be read: {e}"}
