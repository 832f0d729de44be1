"""Runs each trial in a fresh process with a timeout and turns every failure into a status.

Three concerns, a folder each: `launch` (starting and ending processes, the executors, the
host lock, orphans), `protocol` (inside a trial's process: the spec, the worker, arms and the
order of measurement), `store` (the run directory and reuse). The names a user passes to
`torchkiln.api.bench` are importable from here."""

from torchkiln.runner.launch.executors import (
    LocalExecutor,
    PoolExecutor,
    RayExecutor,
    TrialExecutor,
    make_executor,
)
from torchkiln.runner.protocol.trial import STATUSES, TrialSpec

__all__ = [
    "STATUSES",
    "LocalExecutor",
    "PoolExecutor",
    "RayExecutor",
    "TrialExecutor",
    "TrialSpec",
    "make_executor",
]
