"""Synthetic bench documents for the history's tests (conftest puts tests/ on the path)."""

from __future__ import annotations

ENV = {
    "kiln_version": "0.1.0",
    "kiln_git_sha": "abc123",
    "torch": "2.14.1",
    "triton": None,
    "cpu": "x86_64",
    "cpu_count": 2,
    "device": "cpu",
    "gpu": None,
}


def bench_doc(
    medians: dict[str, float],
    *,
    created: str = "2026-12-01T10:00:00+0000",
    workload: str = "simple",
    halfwidth: float = 0.01,
    env: dict | None = None,
    tag: str = "",
) -> dict:
    """A bench document measuring each variant at ``medians`` ms, with an interval of
    +-``halfwidth`` (relative) around each."""
    return {
        "schema": "torchkiln.bench/1",
        "workload": workload,
        "step": "infer",
        "device": "cpu",
        "preset": "tiny",
        "created": created,
        "run_dir": f"kiln-runs/{created}{tag}",
        "environment": {**ENV, **(env or {})},
        "trials": [
            {
                "variant": v,
                "status": "ok",
                "steady_ms": {"median": ms, "ci95": [ms * (1 - halfwidth), ms * (1 + halfwidth)]},
            }
            for v, ms in medians.items()
        ],
    }
