"""Diagnose: `kiln doctor` (can this environment compile and measure?) and `kiln explain` (where
Dynamo breaks the graph or recompiles, and what to change).

Each command module exposes `add_arguments(parser)` and `run(args) -> int` for the CLI, plus a
Python entry point (`doctor.run_doctor()`, `explain.explain(spec)`) returning the JSON report.
Neither imports torch at import time, so `kiln --help` stays fast.
"""

__all__ = ["doctor", "explain"]
