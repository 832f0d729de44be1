"""Diagnose: `kiln doctor` (can this environment compile and measure?), `kiln explain` (where
Dynamo breaks the graph or recompiles, and what to change) and `kiln profile` (where a step's
time goes, layer by layer, with a verdict and the next step).

Each command module exposes `add_arguments(parser)` and `run(args) -> int` for the CLI, plus a
Python entry point (`doctor.run_doctor()`, `explain.explain(spec)`, `profile.run_profile(spec)`)
returning the JSON report. None imports torch at import time, so `kiln --help` stays fast.
"""

__all__ = ["doctor", "explain", "profile"]
