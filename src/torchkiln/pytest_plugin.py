"""`pytest --kiln`: a project's own benchmarks, gated on its history of measurements.

A test asks for the ``kiln_bench`` fixture (or is marked ``@pytest.mark.kiln_benchmark``) and
hands it what to time::

    def test_my_model_speed(kiln_bench):
        model, x = build(), torch.randn(8, 64)
        kiln_bench(lambda: model(x), name="my-model", variant="eager")

With ``--kiln`` the step is warmed up, timed over a number of reps (the median with its 95%
interval), compared with the last N comparable runs in the history store (docs/history.md: the
same name, variant, device and precision) and appended there; the test fails on a regression
beyond the threshold with non-overlapping intervals, naming the run it compared against.
Without ``--kiln`` the plugin does nothing but skip those tests: it is installed with kiln, so
it is present in every suite of an environment that has kiln.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

PYTEST_SCHEMA = "torchkiln.pytest/1"
MARK = "kiln_benchmark"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kiln", "kiln benchmarks (torchkiln)")
    group.addoption(
        "--kiln",
        action="store_true",
        default=False,
        help="run the kiln benchmarks (kiln_bench fixture, kiln_benchmark mark) and fail on a "
        "regression against the history store",
    )
    group.addoption(
        "--kiln-history",
        default=None,
        metavar="PATH",
        help="the history store (default: KILN_HISTORY, else the user's cache)",
    )
    group.addoption(
        "--kiln-against",
        default="history:5",
        metavar="history[:N]",
        help="compare with the last N comparable runs (default history:5)",
    )
    group.addoption(
        "--kiln-threshold",
        type=float,
        default=0.05,
        help="relative slow-down that counts (default 0.05)",
    )
    group.addoption("--kiln-reps", type=int, default=15, help="timed reps per benchmark")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARK}: a benchmark of the project's own model, run with pytest --kiln (it uses "
        "the kiln_bench fixture)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("kiln"):
        return
    skip = pytest.mark.skip(reason="a kiln benchmark: it runs with pytest --kiln")
    for item in items:
        if MARK in item.keywords or "kiln_bench" in getattr(item, "fixturenames", ()):
            item.add_marker(skip)


class KilnBench:
    """The ``kiln_bench`` fixture's value: call it with the step to time."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self.request = request
        self.results: list[dict[str, Any]] = []

    def __call__(
        self,
        fn: Callable[[], Any],
        *,
        name: str | None = None,
        variant: str = "eager",
        step: str = "infer",
        device: str = "cpu",
        reps: int | None = None,
        rep_ms: float = 20.0,
        warmup: int = 3,
    ) -> dict[str, Any]:
        """Time ``fn``, compare with the history, append; fails the test on a regression.
        Returns the comparison rows and the measurement."""
        from torchkiln.history.compare import against_history, format_row, parse_against
        from torchkiln.history.store import Store, resolve, status_line
        from torchkiln.measure.environment import collect
        from torchkiln.measure.stats import summarize
        from torchkiln.measure.timer import StepTimer, calibrate_steps

        config = self.request.config
        n = parse_against(config.getoption("kiln_against"))
        timer = StepTimer(device)
        for _ in range(warmup):
            fn()
        steps = calibrate_steps(timer, fn, rep_ms)
        samples = [timer.time(fn, steps) for _ in range(reps or config.getoption("kiln_reps"))]
        steady = summarize(samples).to_dict()
        doc = {
            "schema": PYTEST_SCHEMA,
            "workload": name or self.request.node.nodeid,
            "step": step,
            "device": device,
            "preset": None,
            "created": _now(),
            "environment": collect(device),
            "trials": [{"variant": variant, "status": "ok", "steady_ms": steady,
                        "steps_per_rep": steps}],
        }  # fmt: skip
        path = resolve(config.getoption("kiln_history"))
        with Store(path) as store:
            rows, _ = against_history(doc, store, n, config.getoption("kiln_threshold"))
            run_id = store.append(doc, "pytest")
        report = {"rows": rows, "steady_ms": steady, "run_id": run_id, "path": str(path)}
        self.results.append(report)
        line = status_line({"path": str(path), "run_id": run_id})
        print(line)
        for r in rows:
            print(format_row(r))
        slower = [r for r in rows if r["verdict"] == "regression"]
        if slower:
            pytest.fail("kiln: slower than its history: " + "; ".join(map(format_row, slower)))
        return report


def _now() -> str:
    from torchkiln.history.records import now

    return now()


@pytest.fixture
def kiln_bench(request: pytest.FixtureRequest) -> KilnBench:
    """Times a step of the project's model and fails on a regression (pytest --kiln)."""
    if not request.config.getoption("kiln"):
        pytest.skip("a kiln benchmark: it runs with pytest --kiln")
    return KilnBench(request)
