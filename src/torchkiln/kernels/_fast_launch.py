"""Eager launches that skip Triton's per-call argument binding. Experimental and opt-in
(`KILN_FAST_LAUNCH=1`, or `fast_launch(True)`) until it is measured on a GPU.

Why: on the H200 (session 6) an eager forward call of kiln's softmax cost 50-60 us of host time
against 10 us for torch.softmax, and rows up to 4096 long were launch-bound. Each
`kernel[grid](...)` call makes Triton's JIT bind and specialise every argument, build a cache key
and look the compiled kernel up; a compiled kernel can instead be launched directly with the same
arguments, which is what Inductor's generated code does.

How: per kernel, the CompiledKernel that the JIT returned is kept under a key of our own that
holds everything Triton specialises on, and more (the current device; per pointer its dtype and
16-byte alignment; per int whether it is 1, divisible by 16 and within 32 bits; every constexpr
and launch option), so two calls Triton would compile apart never share an entry. On a hit the
compiled kernel is launched with the arguments in signature order. A launcher that refuses them
(another Triton's calling convention: a TypeError while it parses, before anything is launched)
turns the fast path off for the process with a warning, and the JIT path runs the call.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch

_state = {"enabled": os.environ.get("KILN_FAST_LAUNCH") == "1", "broken": None}
# The current CUDA device's index, without torch.cuda.current_device()'s lazy-init check (the
# launch paths using it hold CUDA tensors already); None on a torch without it.
_current_device = getattr(torch._C, "_cuda_getDevice", None)


def fast_launch_enabled() -> bool:
    return bool(_state["enabled"]) and _state["broken"] is None


def fast_launch_broken() -> str | None:
    """Why the fast path turned itself off in this process, or None."""
    return _state["broken"]


class fast_launch:
    """Turn the fast path on or off within a block (process-wide, not per thread: for tests and
    benchmarks, which call from one thread)."""

    def __init__(self, on: bool = True) -> None:
        self.on = on

    def __enter__(self) -> None:
        self.prev = _state["enabled"]
        _state["enabled"] = self.on

    def __exit__(self, *exc: object) -> None:
        _state["enabled"] = self.prev


class _Uncacheable(Exception):
    """An argument whose specialisation this module does not model: the JIT path launches."""


def arg_key(a: Any) -> Any:
    """What Triton may specialise a kernel argument on (a superset of it)."""
    if isinstance(a, bool):  # before int: bool is an int
        return ("b", a)
    if isinstance(a, int):
        return ("i", a == 1, a % 16 == 0, -(2**31) <= a < 2**31)
    if isinstance(a, float):
        return "f"
    if a is None:
        return None
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    raise _Uncacheable(type(a).__name__)


def _disable(why: str) -> None:
    _state["broken"] = why
    warnings.warn(f"kiln kernels: fast launch turned off: {why}", RuntimeWarning, stacklevel=3)


class FastKernel:
    """`kernel[grid](*args, **kwargs)` as with a JITFunction, launching a kept compiled kernel
    when one matches. Positional arguments come first, every later parameter by keyword."""

    __slots__ = ("cache", "kernel", "names")

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.names = list(kernel.arg_names)
        self.cache: dict[Any, Any] = {}

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid: tuple[int, ...], args: tuple, kwargs: dict[str, Any]) -> None:
        try:
            device = _current_device() if _current_device is not None else None
            key = (device, tuple(map(arg_key, args)), tuple(sorted(kwargs.items())))
            full = [*args, *(kwargs[n] for n in self.names[len(args) :])]
        except (_Uncacheable, KeyError, TypeError):  # TypeError: an unhashable keyword value
            self.kernel[grid](*args, **kwargs)
            return
        compiled = self.cache.get(key)
        if compiled is None or not fast_launch_enabled():
            # The JIT compiles if it must, launches, and returns the compiled kernel.
            compiled = self.kernel[grid](*args, **kwargs)
            if compiled is not None:
                self.cache[key] = compiled
            return
        try:
            compiled[(*grid, 1, 1)[:3]](*full)
        except TypeError as exc:
            _disable(f"this Triton's compiled-kernel launcher refused the arguments ({exc})")
            self.kernel[grid](*args, **kwargs)


_wrapped: dict[int, FastKernel] = {}


def fast(kernel: Any) -> FastKernel:
    """The FastKernel of a @triton.jit kernel (one per kernel, kept for the process)."""
    found = _wrapped.get(id(kernel))
    if found is None or found.kernel is not kernel:
        found = _wrapped[id(kernel)] = FastKernel(kernel)
    return found
