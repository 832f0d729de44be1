"""The stream search's estimate of a trial's seconds: per kind of compile, and from trials that
ran past their cap as well as from those that finished."""

import pytest

from torchkiln.tune.stream_budget import StreamEstimator, compile_kind
from torchkiln.tune.stream_plan import parse_stream_candidate


@pytest.mark.parametrize(
    "name, kind",
    [
        ("inductor:dynamic=true+bf16", "default:dynamic"),
        ("inductor+bf16+mark_dynamic", "default:dynamic"),
        ("inductor:mode=reduce-overhead,dynamic=true", "reduce-overhead:dynamic"),
        ("inductor:dynamic=false+bf16+bucket=learned", "default:static"),
        ("inductor:mode=reduce-overhead,dynamic=false+bucket=pow2", "reduce-overhead:static"),
        ("inductor:dynamic=false+recompile_limit=64", "default:static"),
        ("inductor+bf16", "default:auto"),
        ("inductor:mode=max-autotune+bf16", "max-autotune:auto"),
    ],
)
def test_compile_kind(name, kind):
    assert compile_kind(parse_stream_candidate(name)) == kind


def finished(wall, compile_s, waited=0.0):
    return {"status": "ok", "process_wall_s": wall, "compile_time_s": compile_s,
            "host_wait_s": waited}  # fmt: skip


def test_a_compile_is_estimated_by_its_kind_then_by_its_shapes_then_by_any():
    est = StreamEstimator()
    assert est(4, "default:static") is None  # nothing learned yet
    # a dynamic training graph: 3 compiles of 66 s; buckets: 4 compiles of 10 s, 20 s waited
    est.learn("dyn", 3, finished(250.0, 198.0), "default:dynamic")
    est.learn("bucket", 4, finished(140.0, 40.0, waited=20.0), "default:static")
    assert est.fixed_s == pytest.approx(80.0)  # the larger of 52 and 140 - 20 - 40
    assert est(4, "default:static") == pytest.approx(80.0 + 4 * 10.0)
    assert est(1, "default:dynamic") == pytest.approx(80.0 + 66.0)
    # reduce-overhead's static graphs not seen yet: the static ones under any mode
    assert est(4, "reduce-overhead:static") == pytest.approx(80.0 + 4 * 10.0)
    # automatic dynamic not seen: one static graph and one dynamic one
    assert est(2, "default:auto") == pytest.approx(80.0 + 10.0 + 66.0)
    assert est(2, "reduce-overhead:auto") == pytest.approx(80.0 + 10.0 + 66.0)
    assert est.per_compile_s == pytest.approx(66.0)
    assert est.learned_from == ["dyn", "bucket"]
    # once seen, its own seconds, under any mode
    est.learn("auto", 2, finished(160.0, 84.0), "default:auto")
    assert est(2, "default:auto") == pytest.approx(80.0 + 84.0)
    assert est(2, "max-autotune:auto") == pytest.approx(80.0 + 84.0)


def test_automatic_dynamic_without_both_kinds_seen_takes_the_largest_of_all():
    est = StreamEstimator()
    est.learn("dyn", 1, finished(150.0, 70.0), "default:dynamic")
    assert est(2, "default:auto") == pytest.approx(80.0 + 2 * 70.0)
    assert est(4, "default:static") == pytest.approx(80.0 + 4 * 70.0)


def timeout(phase, elapsed, compiles, compile_s, waited=0.0, waiting_since=None):
    progress = {"phase": phase, "elapsed_s": elapsed, "compiles": compiles,
                "compile_time_s": compile_s, "waited_s": waited,
                "waiting_since": waiting_since}  # fmt: skip
    return {"status": "timeout", "error": "the trial ran past its cap", "progress": progress}


def test_a_trial_past_its_cap_teaches_lower_bounds():
    est = StreamEstimator()
    # stopped while replaying, after 3 graphs in 197 s of its 246 s (6 s of them waiting): one
    # compile was expected (a dynamic graph), so its 197 s are that compile's, as a finished
    # trial would teach them (graph breaks made three graphs of it)
    est.learn("dyn", 1, timeout("replay", 246.0, 3, 197.0, waited=6.0), "default:dynamic")
    assert est.fixed_s == pytest.approx(43.0)
    assert est.per_compile_by_kind == {"default:dynamic": pytest.approx(197.0)}
    assert est(1, "default:dynamic") == pytest.approx(43.0 + 197.0)


def test_a_trial_stopped_in_its_warm_up_teaches_its_compiles_only():
    est = StreamEstimator()
    # its seconds besides the two finished graphs hold the third one's, in flight; two of the
    # four expected: per graph
    est.learn("ro", 4, timeout("warm-up", 61.0, 2, 25.0), "reduce-overhead:static")
    assert est.fixed_s is None and est(4, "reduce-overhead:static") is None
    assert est.per_compile_by_kind == {"reduce-overhead:static": pytest.approx(12.5)}
    # waiting for a turn when stopped: the wait under way is not in waited_s
    est.learn("w", 1, timeout("steady", 90.0, 1, 30.0, waiting_since=1.0), "default:dynamic")
    assert est.fixed_s is None
    assert est.learned_from == ["ro", "w"]


@pytest.mark.parametrize(
    "r",
    [
        timeout("load", 7.0, 0, 0.0),  # nothing compiled, nothing replayed
        timeout("warm-up", 30.0, 0, 0.0),
        {
            "status": "timeout",
            "error": "ran past 0 s, before it wrote any progress",
            "progress": None,
        },  # fmt: skip
        {"status": "crashed", "error": "signal 11", "progress": None},
        {"status": "ok"},  # no process seconds
    ],
)
def test_a_trial_that_shows_nothing_teaches_nothing(r):
    est = StreamEstimator()
    est.learn("x", 2, r, "default:static")
    assert est.fixed_s is None and est.per_compile_s is None and not est.learned_from
