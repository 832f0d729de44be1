"""`kiln tune` and `torchkiln.tune(...)`: search, prove, recommend, report."""

from __future__ import annotations

import sys
import types
from typing import Any

from torchkiln.tune.api import TuneResult, tune

__all__ = ["TuneResult", "tune"]


class _CallableModule(types.ModuleType):
    """`torchkiln.tune` is both this package and the function: once the package is imported,
    Python resolves `torchkiln.tune` to the module, so the module itself must be callable."""

    def __call__(self, *args: Any, **kwargs: Any) -> TuneResult:
        return tune(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
