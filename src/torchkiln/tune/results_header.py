"""The fields a tune's results.json opens with, whether it searched on a fixed input
(tune.pipeline) or on a stream (tune.stream_search): what was tuned, where, under which limits,
by which kiln and when; tune.schema.json requires them."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from typing import Any

from torchkiln import __version__

TUNE_SCHEMA = "torchkiln.tune/1"


def results_header(
    *,
    workload: str,
    step: str,
    device: str,
    preset: str,
    batch_size: int | None,
    budget_s: float,
    steps: int | None,
    allow_precision: Collection[str],
    environment: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The header of a tune's results document; ``environment`` defaults to this machine's
    (measure.environment), collected now, when the caller has none from its baseline trial."""
    if environment is None:
        from torchkiln.measure.environment import collect

        environment = collect(device)
    return {
        "schema": TUNE_SCHEMA,
        "kiln_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "workload": workload,
        "step": step,
        "device": device,
        "preset": preset,
        "batch_size": batch_size,
        "budget_s": budget_s,
        "steps": steps,
        "allow_precision": sorted(allow_precision),
        "environment": environment,
    }
