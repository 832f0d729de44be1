"""The baseline's drift across the trials of one run is measured and, past 10%, reported."""

from __future__ import annotations

import io

from rich.console import Console

from tests_helpers import synthetic_tune_doc
from torchkiln.report.drift import baseline_drift
from torchkiln.report.render import markdown
from torchkiln.report.table import render


def _trial(variant: str, base_ms: float, paired: bool = True) -> dict:
    return {
        "variant": variant,
        "status": "ok",
        "baseline_ms": {"median": base_ms},
        "speedup": {"paired": paired},
    }


def test_a_steady_baseline_gives_its_spread_and_no_warning():
    # resnet50 infer fp32 on the H200 (kiln d08ad43): baselines 11.667 to 11.869 ms.
    d = baseline_drift([_trial("eager", 11.667), _trial("a", 11.705), _trial("b", 11.869)])
    assert d["warning"] is None
    assert abs(d["spread"] - (11.869 / 11.667 - 1)) < 1e-12
    assert d["baseline_median_ms"] == {"eager": 11.667, "a": 11.705, "b": 11.869}


def test_a_moving_baseline_is_warned_about_with_its_range():
    # resnet50 infer bf16 with a second queue on the host: 4.957 to 9.544 ms.
    trials = [_trial("eager", 7.755), _trial("x", 8.598), _trial("y", 4.957), _trial("z", 9.544)]
    d = baseline_drift(trials)
    assert d["spread"] > 0.9
    assert "moved by 93%" in d["warning"] and "4.957 to 9.544 ms" in d["warning"]


def test_unpaired_and_failed_trials_do_not_count():
    failed = {"variant": "boom", "status": "crashed"}
    xla = _trial("xla", 20.0, paired=False)  # baseline timed apart, not interleaved
    assert baseline_drift([_trial("eager", 10.0), failed, xla]) is None
    d = baseline_drift([_trial("eager", 10.0), _trial("inductor", 10.5), xla])
    assert set(d["baseline_median_ms"]) == {"eager", "inductor"} and d["warning"] is None


def test_the_bench_table_prints_the_warning_and_each_trials_notes():
    trials = [_trial("eager", 5.0), _trial("inductor", 9.0)]
    for t in trials:
        t.update(
            steady_ms={"median": 1.0, "ci95": [0.9, 1.1]},
            speedup={"median": 1.0, "ci95": [0.9, 1.1], "significant": False, "paired": True},
            first_call_s=1.0,
            notes=[],
        )
    trials[1]["notes"] = ["host busy during the timed reps: load average 17.5 [sic]"]
    doc = {
        "workload": "w",
        "step": "infer",
        "device": "cuda",
        "preset": "full",
        "baseline": "eager",
        "run_dir": "r",
        "trials": trials,
        "environment": {},
        "baseline_drift": baseline_drift(trials),
    }
    buf = io.StringIO()
    render(doc, Console(file=buf, width=400))
    text = buf.getvalue()
    assert "warning: the baseline's median moved by 80%" in text
    assert "inductor: host busy during the timed reps: load average 17.5 [sic]" in text


def test_the_tune_report_carries_the_warning():
    doc = synthetic_tune_doc()
    doc["baseline_drift"] = baseline_drift([_trial("eager", 5.0), _trial("inductor", 6.0)])
    assert "- Warning: the baseline's median moved by 20%" in markdown(doc)
    doc["baseline_drift"] = None
    assert "Warning" not in markdown(doc)


def test_the_tune_report_lists_each_trial_note_once_with_its_variants():
    doc = synthetic_tune_doc()
    busy = "host busy during the timed reps: load average 17.5 on 32 usable CPUs"
    doc["trials"][0]["notes"] = [busy]
    doc["trials"][1]["notes"] = [busy, "recompiled during the timed reps"]
    doc["head_to_head_trials"] = [dict(doc["trials"][1], notes=["correctness check skipped"])]
    text = markdown(doc)
    assert text.count(busy) == 1
    assert f"- Note (`eager`, `inductor`): {busy}" in text
    assert "- Note (`inductor`): recompiled during the timed reps" in text
    assert "- Note (`inductor`): correctness check skipped" in text


def test_the_tune_report_sums_the_trials_waits_for_the_host_and_names_the_longest():
    doc = synthetic_tune_doc()
    assert "waited" not in markdown(doc)  # one trial at a time: no turns, no line
    doc["trials"][0]["phase_s"] = {"host_wait": 12.4, "measure": 5.0}
    doc["trials"][1]["phase_s"] = {"host_wait": 240.6}
    doc["head_to_head_trials"] = [dict(doc["trials"][1], phase_s={"host_wait": 0.2})]
    text = markdown(doc)
    assert "- Trials waited 253 s in all for the host" in text
    assert "the longest wait, 241 s, was `inductor`'s" in text
