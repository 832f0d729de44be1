"""Eager calls' launch cache: an op body's launch kept per key and replayed through the compiled
kernel's own launcher, so a repeated call skips kiln's launch policy and Triton's JIT dispatch.

On an H200's host (commit 542b55c, benchmarks/kernel_host_path.py, softmax fp32 4096 x 2048) an
eager `functional.softmax` call cost 32 us of host time: 7.6 of them kiln's launcher choosing
the launch, 16.4 Triton's `kernel[grid](...)` (argument binding, specialisation, its cache
lookup), against 9.2 for the compiled kernel's launcher called with every argument. A call that
costs the host more than the kernel costs the GPU is launch-bound (4096 x 2048 fp32 runs in
17 us), so short rows were measured at the host's speed, which moved by machine (26-93 us a call).

A key holds everything the launch depends on that can change between calls with the same
kernel: shapes, strides, dtypes, the device, each pointer's 16-byte alignment (Triton
specialises on it, as it does on ints equal to 1 or divisible by 16, which the shapes and
strides fix), and whatever the op body reads (the scale's sign, say). On a miss the op body
runs as before with its launch recorded (`launchable` hands back a recording kernel); a body
that made exactly one launch becomes a `Replay`: that launch's compiled kernel, its grid and its
arguments in the kernel's order, the per-call ones (tensors, the scale) left as slots.

The compiled launcher is Triton's internal API (`JITFunction.warmup`, `CompiledKernel[grid]`,
every parameter passed in signature order, constexprs included: Triton 3.6 and 3.8), so the
first replay of each kernel in a process is checked against the JIT's own launch, bit for bit;
a mismatch or an error turns the cache off for that kernel, with a warning and the reason in
`status()`. KILN_LAUNCH_CACHE=0 turns it off altogether.
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import Any

import torch

from torchkiln.kernels import _launch

# Read once: the cache sits on every eager call. Tests and benchmarks set it directly.
enabled = os.environ.get("KILN_LAUNCH_CACHE", "1") != "0"
# Keys per cache before it is cleared: a serving loop over ever-new shapes must not grow it
# without bound (each entry holds a small list and a compiled kernel Triton keeps anyway).
MAX_ENTRIES = 4096

_lock = threading.Lock()
# Kernel name -> "ok" once its first replay matched the JIT launch, else why it is off.
_checked: dict[str, str] = {}


def active() -> bool:
    """Whether this call may use the cache: on, and inside `direct_launches` (an eager call that
    no tracer needs to see; under torch.compile the op's launches must stay traceable)."""
    return enabled and getattr(_launch._state, "direct", False)


def status() -> dict[str, str]:
    """Per kernel: "ok" (replays checked against the JIT launch), or why replay is off."""
    return dict(_checked)


def launch_cache_status() -> dict[str, str]:
    """The eager launch cache per kernel this process has launched: "ok" where its replays
    matched Triton's JIT launch bit for bit, else why it is off (`torchkiln.kernels`'s name for
    `status`)."""
    return status()


class Replay:
    """One recorded launch, replayed with new per-call arguments in `slots`."""

    __slots__ = ("args", "runner", "shapes", "slots")

    def __init__(self, runner: Any, args: list, slots: tuple[int, ...]):
        self.runner, self.args, self.slots = runner, args, slots
        # The recorded outputs' shapes, for an op whose outputs are not shaped like its inputs.
        self.shapes: tuple = ()

    def __call__(self, values: tuple) -> None:
        args = self.args.copy()
        for i, v in zip(self.slots, values, strict=True):
            args[i] = v
        self.runner(*args)


def _kernel_name(kernel: Any) -> str:
    fn = getattr(kernel, "fn", kernel)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def bound(launch: tuple) -> list:
    """The recorded launch's (kernel, grid, args, kwargs) argument for each of the kernel's
    parameters, in their order, defaults filled in: how the compiled launcher takes them."""
    kernel, _, args, kwargs = launch
    values = []
    for i, p in enumerate(kernel.params):
        if i < len(args):
            values.append(args[i])
        elif p.name in kwargs:
            values.append(kwargs[p.name])
        elif p.has_default:
            values.append(p.default)
        else:
            raise ValueError(f"{p.name} was not given")
    return values


def build(launch: tuple, values: list, slots: tuple[int, ...]) -> Replay:
    """A Replay of `launch` (its arguments `values`, from `bound`) whose arguments at `slots`
    (positions in the kernel's parameters) are given per call; ValueError where a tensor
    argument is not a slot (the cache would hold it and reuse it)."""
    kernel, grid, args, kwargs = launch
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor) and i not in slots:
            raise ValueError(f"tensor argument {kernel.params[i].name} is not per-call")
    compiled = kernel.warmup(*args, grid=grid, **kwargs)
    if compiled is None:
        raise ValueError("warmup returned no compiled kernel")
    runner = compiled[(*grid, 1, 1)[:3]]
    template = [None if i in slots else v for i, v in enumerate(values)]
    return Replay(runner, template, slots)


def _capturing() -> bool:
    # Recording checks its first replay with a synchronising comparison, which a CUDA graph's
    # capture forbids: calls made while capturing launch through the JIT and are not recorded.
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


class LaunchCache:
    """Replays of one op body's launch, by key (the module docstring). `slots` are the
    positions, in the kernel's parameters, of the per-call arguments (tensors, the scale), and
    `outs` the indices in `slots` of the outputs the body allocates and returns (one tensor,
    or a tuple of them in this order)."""

    def __init__(self, slots: tuple[int, ...], outs: int | tuple[int, ...]) -> None:
        self.slots = slots
        self.outs = (outs,) if isinstance(outs, int) else outs
        self.entries: dict[tuple, Replay | None] = {}

    def record(self, key: tuple, body: Any) -> Any:
        """Run `body()` (which returns the outputs) with its launches recorded, and store under
        `key` a replay of its launch where it made exactly one. Returns what `body()` did."""
        if key in self.entries or _capturing():
            return body()
        launches: list[tuple] = []
        prev = getattr(_launch._state, "record", None)
        _launch._state.record = launches
        try:
            result = body()
        finally:
            _launch._state.record = prev
        outs = result if isinstance(result, tuple) else (result,)
        replay = self._checked_replay(launches[0], outs) if len(launches) == 1 else None
        if len(self.entries) >= MAX_ENTRIES:
            self.entries.clear()
        self.entries[key] = replay
        return result

    def _checked_replay(self, launch: tuple, outs: tuple) -> Replay | None:
        name = _kernel_name(launch[0])
        if _checked.get(name, "ok") != "ok":
            return None
        try:
            every = bound(launch)
            values = [every[i] for i in self.slots]
            if len(outs) != len(self.outs) or any(
                values[i] is not out for i, out in zip(self.outs, outs, strict=True)
            ):
                raise ValueError("the launch's outputs are not the body's results")
            replay = build(launch, every, self.slots)
            replay.shapes = tuple(out.shape for out in outs)
            if name not in _checked:
                # The first replay of this kernel in the process: into fresh outputs,
                # compared bit for bit with the JIT launch's.
                fresh = [torch.empty_like(out) for out in outs]
                for i, f in zip(self.outs, fresh, strict=True):
                    values[i] = f
                replay(tuple(values))
                for f, out in zip(fresh, outs, strict=True):
                    if not torch.equal(f.view(torch.uint8), out.view(torch.uint8)):
                        raise ValueError("its replay's output differs from the JIT launch's")
        except (TypeError, ValueError, IndexError, AttributeError, RuntimeError) as exc:
            with _lock:
                _checked[name] = f"{type(exc).__name__}: {exc}"
            warnings.warn(
                f"kiln: launch cache off for {name} ({_checked[name]}); its eager calls take "
                "Triton's JIT launch, as before",
                RuntimeWarning,
                stacklevel=3,
            )
            return None
        with _lock:
            _checked[name] = "ok"
        return replay
