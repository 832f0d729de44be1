"""What every launcher shares: how a @triton.jit kernel is launched so torch.compile can see it."""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch

_state = threading.local()


class direct_launches:
    """Within it, `launchable` hands back the bare kernel: the caller has established that no
    tracer needs to see the launch (functional.direct_call). Outside a `triton_op` a
    `wrap_triton` wrapper is enabled and routes every eager launch through its higher-order op:
    on the H200 that made an eager forward call cost 200-460 us on the host against 53 us for
    the backward, which runs inside the op (torch 2.11, commit 50de622). A class, not
    contextlib: it sits on every eager call. Thread-local, as a serving framework calls from
    several threads."""

    __slots__ = ("prev",)

    def __enter__(self) -> None:
        self.prev = getattr(_state, "direct", False)
        _state.direct = True

    def __exit__(self, *exc: object) -> None:
        _state.direct = self.prev


def launchable(kernel: Any) -> Any:
    """The kernel wrapped with `torch.library.wrap_triton`, so that a launch inside a `triton_op`
    is traced into the graph (Inductor then calls the kernel itself, no graph break); inside
    `direct_launches` the kernel itself, launched through Triton's JIT, or, while
    _launch_cache records an op body, a kernel that records its launch as it makes it.

    Under TRITON_INTERPRET=1 `@triton.jit` returns an InterpretedFunction, which torch 2.11 does
    not accept in wrap_triton (2.14 passes it through); interpreted kernels are only launched
    eagerly on CPU tensors by the tests, so they are launched as they are.
    """
    if getattr(_state, "direct", False):
        record = getattr(_state, "record", None)
        return kernel if record is None else _Recording(kernel, record)
    if is_interpreted(kernel):
        return kernel
    return torch.library.wrap_triton(kernel)


class _Recording:
    """A kernel whose launches are appended to `launches` (kernel, grid, args, kwargs) as they
    are made: what _launch_cache keeps of an op body's launch."""

    __slots__ = ("kernel", "launches")

    def __init__(self, kernel: Any, launches: list) -> None:
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid: tuple) -> Any:
        def launch(*args: Any, **kwargs: Any) -> Any:
            self.launches.append((self.kernel, grid, args, kwargs))
            return self.kernel[grid](*args, **kwargs)

        return launch


def is_interpreted(kernel: Any) -> bool:
    """True when `kernel` was decorated while TRITON_INTERPRET=1 (it then runs on CPU tensors)."""
    from triton.runtime.jit import JITFunction

    return not isinstance(kernel, JITFunction)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive ints (and SymInts under tracing). Not triton.cdiv: in Triton 3.8
    that is a ConstexprFunction costing 1.9 us a call on this repository's CPU host, against
    0.1 us here, on every launch."""
    return (a + b - 1) // b


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (>= 1); a block dimension must be a power of two in Triton."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def device_info(x: torch.Tensor) -> tuple[int, int]:
    """(SMs, compute capability major) of x's GPU; on the CPU (Triton's interpreter, in tests)
    two programs' worth of SMs and Hopper's major, so the tests take the H200's paths. A CUDA
    tensor traced where no GPU is visible (fake tensors on a CPU-only host) gets an H200's 132
    SMs: the grid it sizes is a speed choice, and any size launches correctly."""
    if not x.is_cuda:
        return (2, 9)
    return _cuda_device(x.device) if torch.cuda.is_available() else (132, 9)


@functools.cache
def _cuda_device(device: torch.device) -> tuple[int, int]:
    props = torch.cuda.get_device_properties(device)
    return props.multi_processor_count, props.major
