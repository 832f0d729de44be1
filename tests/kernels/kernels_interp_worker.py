"""The process that runs the Triton kernels under Triton's CPU interpreter.

TRITON_INTERPRET must be set before triton is first imported in a process: triton.language's own
@jit helpers (tl.max, tl.sum, ...) are decorated at import and read the variable then, as do
kiln's kernels. Setting it inside the pytest process would depend on who imported triton first,
and would leak into everyone else's tests; a spawned worker has a clean interpreter instead.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any


def init() -> None:
    """Pool initializer: runs in the fresh worker before anything imports triton."""
    if "triton" in sys.modules:
        raise RuntimeError("triton was imported before TRITON_INTERPRET=1 could be set")
    os.environ["TRITON_INTERPRET"] = "1"


def call(module: str, fn: str, *args: Any, **kwargs: Any) -> Any:
    """torchkiln.kernels.<module>.<fn>(*args, **kwargs), checking the kernels are interpreted."""
    from torchkiln.kernels._launch import is_interpreted

    mod = importlib.import_module(f"torchkiln.kernels.{module}")
    kernels = [v for k, v in vars(mod).items() if k.startswith("_") and hasattr(v, "arg_names")]
    assert kernels and all(map(is_interpreted, kernels)), f"{module}'s kernels are not interpreted"
    return getattr(mod, fn)(*args, **kwargs)


def loop_bounds_problem() -> str | None:
    """None where this interpreter runs a loop bounded by a tensor (`range(tl.program_id(0),
    n)`, as kiln's persistent and looped kernels do), else why not. Triton 3.6's interpreter
    turns the bound into an int with int() of a one-element numpy array, which numpy 2.4 refuses
    (3.6 with numpy 2.3.5 runs, Triton 3.8 squeezes the array first); a GPU is unaffected."""
    import numpy as np
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _count(out_ptr, n):
        total = 0
        for _ in range(tl.program_id(0), n):
            total += 1
        tl.store(out_ptr, total)

    out = torch.zeros(1, dtype=torch.int32)
    try:
        _count[(1,)](out, 3)
    except Exception as exc:  # noqa: BLE001 - the reason becomes the tests' skip message
        return (f"Triton {triton.__version__}'s interpreter cannot bound a loop by a tensor "
                f"under numpy {np.__version__} ({type(exc).__name__}: {exc}); run these tests "
                "with numpy < 2.4 or Triton >= 3.8")  # fmt: skip
    return None if out.item() == 3 else f"the interpreter counted {out.item()} iterations, not 3"
