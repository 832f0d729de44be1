"""No compilation after warm-up: the switch that enforces it, and how an attempt is recognised.

Two mechanisms, picked by feature detection:
- ``stance``: ``torch.compiler.set_stance("fail_on_recompile")`` (torch >= 2.6): a frame whose
  cached code does not fit raises instead of compiling.
- ``config``: ``torch._dynamo.config.error_on_recompile``, for a torch without set_stance: the
  recompile raises ``RecompileError`` before any tracing.
Both are process-wide switches in torch, so `STRICT` reference-counts them across every
BucketedModule in the process. While one is on, another thread's *unrelated* compiled function
that needs to recompile fails too; serve from a process that is done compiling other things.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from torchkiln.serve.shapes import ServeConfigError

GUARDS = ("auto", "stance", "config")
# set_stance's error is a plain RuntimeError; this substring of its message identifies it.
_STANCE_MARK = "fail_on_recompile"


def stance_available() -> bool:
    import torch

    return hasattr(getattr(torch, "compiler", None), "set_stance")


def resolve_guard(name: str) -> str:
    if name not in GUARDS:
        raise ServeConfigError(f"recompile_guard={name!r}; choose from {list(GUARDS)}")
    if name == "auto":
        return "stance" if stance_available() else "config"
    if name == "stance" and not stance_available():
        raise ServeConfigError(
            "recompile_guard='stance' needs torch.compiler.set_stance (torch>=2.6)"
        )
    return name


def describe(kind: str) -> str:
    return {
        "stance": 'torch.compiler.set_stance("fail_on_recompile")',
        "config": "torch._dynamo.config.error_on_recompile",
    }[kind]


class _StrictSwitch:
    """Reference-counted: overlapping users must not switch it off under each other's feet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = {"stance": 0, "config": 0}
        self._undo: dict[str, Callable[[], None]] = {}

    @contextmanager
    def on(self, kind: str) -> Iterator[None]:
        with self._lock:
            if self._users[kind] == 0:
                self._undo[kind] = self._enable(kind)
            self._users[kind] += 1
        try:
            yield
        finally:
            with self._lock:
                self._users[kind] -= 1
                if self._users[kind] == 0:
                    self._undo.pop(kind)()

    @staticmethod
    def _enable(kind: str) -> Callable[[], None]:
        import torch

        if kind == "stance":
            # The returned object has already set the stance; its __exit__ restores the prior one.
            stance = torch.compiler.set_stance("fail_on_recompile")
            return lambda: stance.__exit__(None, None, None)
        prior = torch._dynamo.config.error_on_recompile
        torch._dynamo.config.error_on_recompile = True
        return lambda: setattr(torch._dynamo.config, "error_on_recompile", prior)


STRICT = _StrictSwitch()


def is_recompile_error(exc: BaseException) -> bool:
    from torch._dynamo.exc import RecompileError

    if isinstance(exc, RecompileError):
        return True
    return isinstance(exc, RuntimeError) and _STANCE_MARK in str(exc)


def compile_count() -> int:
    """Graphs compiled so far in this process (dynamo's own counter, all threads)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@contextmanager
def compile_settings(n_specialisations: int) -> Iterator[None]:
    """Settings while buckets compile (warm-up, or lazily before it).

    - One cache entry per specialised bucket must fit under dynamo's per-function recompile limit
      (8 by default), or the ninth bucket would silently run eagerly.
    - Automatic dynamic shapes off: after two sizes of a dim it would compile one generic graph
      and merge the buckets the caller asked to specialise; dims meant to be shared are marked.
    - CUDA-graph trees warn after 8 recorded sizes of one dynamic graph; with buckets, recording
      one graph per bucket is the plan, not an accident.
    """
    import torch

    dyn = torch._dynamo.config
    patches: dict[str, object] = {"automatic_dynamic_shapes": False}
    limit_name = "recompile_limit" if hasattr(dyn, "recompile_limit") else "cache_size_limit"
    patches[limit_name] = max(getattr(dyn, limit_name), 4 * n_specialisations + 16)
    acc_name = (
        "accumulated_recompile_limit"
        if hasattr(dyn, "accumulated_recompile_limit")
        else "accumulated_cache_size_limit"
    )
    if hasattr(dyn, acc_name):
        patches[acc_name] = max(getattr(dyn, acc_name), 4 * n_specialisations + 256)
    triton_cfg = torch._inductor.config.triton
    with dyn.patch(**patches):
        if hasattr(triton_cfg, "cudagraph_dynamic_shape_warn_limit"):
            with torch._inductor.config.patch({"triton.cudagraph_dynamic_shape_warn_limit": None}):
                yield
        else:
            yield
