"""What every launcher shares: how a @triton.jit kernel is launched so torch.compile can see it."""

from __future__ import annotations

from typing import Any

import torch


def launchable(kernel: Any) -> Any:
    """The kernel wrapped with `torch.library.wrap_triton`, so that a launch inside a `triton_op`
    is traced into the graph (Inductor then calls the kernel itself, no graph break).

    Under TRITON_INTERPRET=1 `@triton.jit` returns an InterpretedFunction, which torch 2.11 does
    not accept in wrap_triton (2.14 passes it through); interpreted kernels are only launched
    eagerly on CPU tensors by the tests, so they are launched as they are.
    """
    from triton.runtime.jit import JITFunction

    if isinstance(kernel, JITFunction):
        return torch.library.wrap_triton(kernel)
    return kernel


def is_interpreted(kernel: Any) -> bool:
    """True when `kernel` was decorated while TRITON_INTERPRET=1 (it then runs on CPU tensors)."""
    from triton.runtime.jit import JITFunction

    return not isinstance(kernel, JITFunction)


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (>= 1); a block dimension must be a power of two in Triton."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()
