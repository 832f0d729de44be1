"""The early-stop rule of the timed reps, on synthetic sample sequences."""

import pytest

from torchkiln.measure.stats import paired_speedup
from torchkiln.measure.stopping import StopRule, relative_halfwidth
from torchkiln.measure.timer import time_round_robin


class ScriptedTimer:
    """Returns per-step times from a script, one per call, for each fn by identity."""

    def __init__(self, scripts):
        self.scripts = {id(fn): iter(seq) for fn, seq in scripts}

    def time(self, fn, steps):
        return next(self.scripts[id(fn)])


def run(rule, base_seq, var_seq):
    def a():
        return None

    def b():
        return None

    timer = ScriptedTimer([(a, var_seq), (b, base_seq)])
    reason = []

    def known(samples):
        done = len(samples[0])
        why = rule.decide(done)
        if why is None and rule.may_check(done):
            s = paired_speedup(samples[1], samples[0])
            why = rule.decide(done, s.median, s.ci95)
        if why:
            reason.append(why)
        return why is not None

    samples = time_round_robin(timer, [a, b], rule.max_reps, 1, until=known)
    return samples, reason[0] if reason else "max_reps"


def test_steady_ratio_stops_at_the_floor():
    rule = StopRule(max_reps=40, halfwidth=0.005, min_reps=10, arms=2)
    samples, reason = run(rule, [2.0] * 40, [1.0] * 40)
    assert reason == "interval"
    assert len(samples[0]) == len(samples[1]) == 10


def test_noisy_ratio_runs_to_the_ceiling():
    rule = StopRule(max_reps=20, halfwidth=0.005, min_reps=10, arms=2)
    noisy = [1.0, 1.2] * 10  # ratios alternate 2.0 and 1.667: an interval far wider than 0.5%
    samples, reason = run(rule, [2.0] * 20, noisy)
    assert reason == "max_reps"
    assert len(samples[0]) == 20


def test_off_runs_every_rep():
    rule = StopRule(max_reps=15, halfwidth=None, arms=2)
    samples, reason = run(rule, [2.0] * 15, [1.0] * 15)
    assert reason == "max_reps" and len(samples[0]) == 15


def test_stops_only_at_whole_rotations():
    rule = StopRule(max_reps=30, halfwidth=0.005, min_reps=10, arms=3)
    assert not rule.may_check(10)  # 10 reps of 3 arms: arm orders not yet balanced
    assert rule.may_check(12)
    assert rule.decide(12, 1.5, (1.499, 1.501)) == "interval"
    assert rule.decide(9, 1.5, (1.499, 1.501)) is None  # below the floor


def test_time_and_ceiling_reasons():
    rule = StopRule(max_reps=15)
    assert rule.decide(15) == "max_reps"
    assert rule.decide(3, out_of_time=True) == "time"
    assert rule.record(12, "interval") == {
        "stop_halfwidth": 0.005,
        "min_reps": 10,
        "max_reps": 15,
        "reps_run": 12,
        "stop_reason": "interval",
    }


def test_halfwidth_is_relative_to_the_median():
    assert relative_halfwidth(2.0, (1.98, 2.02)) == pytest.approx(0.01)
    assert relative_halfwidth(0.0, (0.0, 0.0)) == float("inf")


def test_rejects_bad_settings():
    with pytest.raises(ValueError, match="halfwidth"):
        StopRule(max_reps=10, halfwidth=0)
    with pytest.raises(ValueError, match="max_reps"):
        StopRule(max_reps=0)


def test_stop_interval_argument_takes_fractions_and_percentages():
    import argparse

    from torchkiln.cli_args import stop_interval

    assert stop_interval("0.5%") == pytest.approx(0.005)
    assert stop_interval("0.01") == pytest.approx(0.01)
    assert stop_interval("0") is None
    with pytest.raises(argparse.ArgumentTypeError, match="fraction"):
        stop_interval("tight")


class ConstantTimer:
    """The variant's step takes 1 ms and the baseline's 2 ms, every rep."""

    device = "cpu"

    def __init__(self, variant):
        self.variant = variant

    def time(self, fn, steps):
        return 1.0 if fn is self.variant else 2.0


def timed(**spec_fields):
    from torchkiln.measure.stats import paired_speedup
    from torchkiln.runner.protocol.measure_trial import mean_per_rep, timed_reps
    from torchkiln.runner.protocol.trial import TrialSpec

    def variant():
        return None

    def baseline():
        return None

    spec = TrialSpec(workload="simple", variant="eager", **spec_fields)
    result = {"notes": []}
    samples = timed_reps(
        spec,
        ConstantTimer(variant),
        [variant, baseline],
        result,
        lambda s: paired_speedup(mean_per_rep(s[1:]), s[0]),
    )
    return samples, result


def test_a_trial_records_why_its_reps_stopped():
    samples, result = timed(reps=15)
    assert len(samples[0]) == len(samples[1]) == 10  # the floor, a whole A B / B A rotation
    assert result["reps"] == result["reps_run"] == 10
    assert result["stop_reason"] == "interval" and result["stop_halfwidth"] == 0.005
    samples, result = timed(reps=15, stop_halfwidth=None)
    assert len(samples[0]) == 15 and result["stop_reason"] == "max_reps"
    samples, result = timed(reps=15, max_measure_s=0.0)
    assert result["stop_reason"] == "time" and result["reps_run"] == 1
