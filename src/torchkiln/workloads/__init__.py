"""Workloads: a model, its example inputs and the kind of step to run; a registry; user specs."""

from torchkiln.workloads import zoo  # noqa: F401  (registers the built-ins)
from torchkiln.workloads.base import (
    PRESETS,
    STEP_KINDS,
    Workload,
    available_workloads,
    register_workload,
)
from torchkiln.workloads.loader import load_workload

__all__ = [
    "PRESETS",
    "STEP_KINDS",
    "Workload",
    "available_workloads",
    "load_workload",
    "register_workload",
]
