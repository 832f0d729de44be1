"""The one thread that runs all of a BucketedModule's model calls.

Why a dedicated thread: CUDA-graph trees keep their recorded graphs per host thread (torch 2.14
re-records in every new thread), and a replay writes static output buffers. Running every call,
warm-up included, on one worker makes the warm-up's captures the ones that serve, and serialises
replays so no caller reads a buffer another replay is overwriting.

Why a process-wide lock on CUDA: BucketedModules over the same model class and variant share
compiled code (dynamo caches per code object), and before torch 2.14 also its recorded graphs;
two modules replaying at once could then race on one graph's buffers. One GPU runs them one at
a time anyway.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
CUDA_LOCK = threading.RLock()


def _init_cudagraph_tls() -> None:
    """Before torch 2.14 (pytorch#123177), CUDA-graph trees set up their per-thread state only
    in the thread that imported them (and autograd's threads) and assert in any other thread.
    Give this thread its own state, the way the module does for its importing thread."""
    import torch
    from torch._inductor import cudagraph_trees

    local = getattr(cudagraph_trees, "local", None)
    if local is None or hasattr(local, "tree_manager_containers"):
        return
    init = getattr(cudagraph_trees, "_initialize_tls", None)
    if init is not None:
        init(local)
        return
    local.tree_manager_containers = {}
    local.tree_manager_locks = defaultdict(threading.Lock)
    torch._C._stash_obj_in_tls("tree_manager_containers", local.tree_manager_containers)
    torch._C._stash_obj_in_tls("tree_manager_locks", local.tree_manager_locks)


class Worker:
    def __init__(self, device: Any) -> None:
        self.device = device
        self._ident: int | None = None
        self._pool = ThreadPoolExecutor(1, "kiln-serve", initializer=self._start)

    def _start(self) -> None:
        self._ident = threading.get_ident()
        if self.device.type == "cuda":
            import torch

            if self.device.index is not None:
                torch.cuda.set_device(self.device.index)
            _init_cudagraph_tls()

    def _locked(self, fn: Callable[..., T], *args: Any) -> T:
        if self.device.type != "cuda":
            return fn(*args)
        with CUDA_LOCK:
            return fn(*args)

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the worker and wait for it; exceptions propagate to the caller."""
        if threading.get_ident() == self._ident:  # re-entrant: the model called us
            return fn(*args)
        return self._pool.submit(self._locked, fn, *args).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
