"""`kiln tune` and `torchkiln.tune(...)`: search, prove, recommend, report."""

from __future__ import annotations

from torchkiln.tune.api import TuneResult, tune

__all__ = ["TuneResult", "tune"]
