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
