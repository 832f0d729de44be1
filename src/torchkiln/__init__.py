"""torchkiln: find, with honest numbers, the fastest correct way to run a PyTorch model."""

from __future__ import annotations

__version__ = "0.1.0"

# The public API is imported lazily so that `import torchkiln` stays cheap (no torch import) for
# the CLI's argument parsing and for trial workers that set the environment before torch loads.
__all__ = [
    "bench",
    "tune",
    "load",
    "Workload",
    "register_workload",
    "parse_variant",
    "__version__",
]


def __getattr__(name: str):
    if name == "bench":
        from torchkiln.api import bench

        return bench
    if name == "tune":
        from torchkiln.tune import tune

        return tune
    if name in ("Workload", "register_workload"):
        from torchkiln import workloads

        return getattr(workloads, name)
    if name == "load":
        from torchkiln.ship.load import load

        return load
    if name == "parse_variant":
        from torchkiln.variants import parse_variant

        return parse_variant
    raise AttributeError(f"module 'torchkiln' has no attribute {name!r}")
