"""The pytest plugin: inert without --kiln; with it, a project's benchmark is timed, kept in
the history, and a slowdown against the history fails the test."""

from __future__ import annotations

import importlib.metadata

pytest_plugins = ["pytester"]

BENCHMARK = """
import os
import time

import pytest


def step():
    time.sleep(float(os.environ.get("STEP_S", "0.001")))


def test_model_speed(kiln_bench):
    kiln_bench(step, name="tiny-model", reps=5, rep_ms=1)


@pytest.mark.kiln_benchmark
def test_marked(kiln_bench):
    kiln_bench(step, name="tiny-model-marked", reps=3, rep_ms=1)


def test_ordinary():
    assert True
"""


def _plugin_args() -> list[str]:
    # Once kiln is installed with its entry point, pytest loads the plugin by itself.
    installed = any(
        e.value == "torchkiln.pytest_plugin"
        for e in importlib.metadata.entry_points(group="pytest11")
    )
    return [] if installed else ["-p", "torchkiln.pytest_plugin"]


def test_without_kiln_the_benchmarks_are_skipped_and_nothing_is_stored(pytester, tmp_path):
    pytester.makepyfile(test_bench=BENCHMARK)
    store = tmp_path / "h.sqlite"
    result = pytester.runpytest(*_plugin_args(), "--kiln-history", str(store), "-rs")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(["*runs with pytest --kiln*"])
    assert not store.exists()


def test_a_benchmark_run_twice_catches_an_injected_slowdown(pytester, tmp_path, monkeypatch):
    from torchkiln.history.store import Store

    pytester.makepyfile(test_bench=BENCHMARK)
    store = tmp_path / "h.sqlite"
    args = [*_plugin_args(), "--kiln", "--kiln-history", str(store), "-s"]
    monkeypatch.setenv("STEP_S", "0.001")
    first = pytester.runpytest(*args)
    first.assert_outcomes(passed=3)
    first.stdout.fnmatch_lines(["*history: run 1 appended to *"])
    # 50 times slower: far outside the first run's interval and any threshold.
    monkeypatch.setenv("STEP_S", "0.05")
    second = pytester.runpytest(*args, "-k", "test_model_speed")
    second.assert_outcomes(failed=1, deselected=2)
    second.stdout.fnmatch_lines(["*kiln: slower than its history*regression; against run 1*"])
    with Store(store) as s:
        rows = s.measurements("tiny-model")
    assert [(r["run_id"], r["kind"], r["variant"]) for r in rows] == [
        (3, "pytest", "eager"),
        (1, "pytest", "eager"),
    ]
    assert rows[0]["median_ms"] > rows[1]["median_ms"]
