"""When an eager call may skip torch.library's dispatcher and run an op's body itself.

Used by the functional API (forward calls) and by the ops' autograd formulas (backward calls in
eager training); neither imports the other, so this lives apart.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _flag(name: str) -> bool:
    """A dispatcher state check that must be False for a direct call; a torch without it
    (renamed in some version) counts as True, so the call keeps the op."""
    probe = getattr(torch._C, name, None)
    return True if probe is None else bool(probe())


def direct_call(*tensors: Tensor | None) -> bool:
    """Whether an eager call may skip torch.library's dispatch and run the op's body itself
    (the same launcher call the op would make). torch.library costs ~15 us a call: on this
    repository's CPU host a 4x8 softmax took 32.1 us through the op and 17.5 us through its
    body, and on the H200 short rows are launch-bound (benchmarks/README.md). Everything the
    dispatcher has to see keeps the op: CPU tensors, compilation and tracing, autograd, tensor
    subclasses (fake, functional), dispatch and torch-function modes (profilers, FLOP
    counters), functorch transforms (vmap, grad)."""
    ts = [t for t in tensors if t is not None]
    return ts[0].is_cuda and dispatch_free(ts)


def dispatch_free(ts: list[Tensor]) -> bool:
    """direct_call's conditions other than the device (so they can be tested on the CPU)."""
    if torch.compiler.is_compiling():
        return False
    if any(type(t) is not Tensor for t in ts):
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in ts):
        return False
    return not (
        _flag("_len_torch_dispatch_stack")
        or _flag("_is_torch_function_mode_enabled")
        or _flag("_are_functorch_transforms_active")
    )
