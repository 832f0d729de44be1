"""time_spent: per-stage wall time and trial phases summed over trials, and its report section."""

import pytest

from tests_helpers import synthetic_tune_doc
from torchkiln.report import time_spent as section
from torchkiln.tune.time_spent import (
    StageClock,
    beside_seconds,
    console_line,
    phase_seconds,
    stage_seconds,
    time_spent,
)


def synthetic_doc():
    trials = [
        {"id": "00-eager", "process_wall_s": 20.0, "phase_s": {"start": 3.0, "setup": 11.0}},
        {
            "id": "01-inductor",
            "process_wall_s": 70.0,
            "phase_s": {"start": 3.0, "setup": 12.0, "first_call": 17.0, "measure": 19.0},
        },
        {"id": "02-old", "reused": True, "phase_s": {"measure": 999.0}},
        {"id": "03-crash", "status": "crashed", "phase_s": None, "process_wall_s": 4.0},
    ]
    h2h = [{"id": "90-h2h", "process_wall_s": 30.0, "phase_s": {"measure": 21.0, "setup": 5.0}}]
    return {"wall_s": 200.0, "trials": trials, "head_to_head_trials": h2h}


def test_phase_sums_equal_the_per_trial_sums():
    doc = synthetic_doc()
    spent = time_spent(doc, {"search": 150.0, "head to head": 40.0})
    measured = [t for t in doc["trials"] + doc["head_to_head_trials"] if not t.get("reused")]
    for name in ("start", "setup", "first_call", "measure"):
        want = sum((t.get("phase_s") or {}).get(name, 0.0) for t in measured)
        assert spent["phases_s"][name] == pytest.approx(want)
    assert spent["phases_s"]["measure"] == pytest.approx(40.0)  # the reused trial's 999 s not
    assert spent["trials"] == 4 and spent["reused_trials"] == 1
    assert spent["trial_process_s"] == pytest.approx(124.0)
    assert spent["outside_phases_s"] == pytest.approx(124.0 - 91.0)
    assert spent["stages_s"] == {"search": 150.0, "head to head": 40.0}
    assert spent["wall_s"] == 200.0


def test_a_stopped_trials_seen_phases_are_counted_apart_not_as_outside_its_phases():
    # A compile stopped at the search's end leaves no phase record of its own; its launcher's
    # polled account stands in, each phase but the waits marked unfinished.
    stopped = {
        "id": "04-autotuned",
        "status": "timeout",
        "phase": "first_call",
        "process_wall_s": 350.0,
        "phase_s_seen": {"start": 0.5, "setup": 2.0, "first_call": 268.0, "host_wait": 79.0},
    }
    doc = synthetic_doc()
    before = time_spent(doc, {"search": 150.0})
    doc["trials"].append(stopped)
    after = time_spent(doc, {"search": 150.0})
    assert after["phases_s"]["first_call, unfinished"] == pytest.approx(268.0)
    assert after["phases_s"]["setup, unfinished"] == pytest.approx(2.0)
    assert after["phases_s"]["first_call"] == before["phases_s"]["first_call"]  # measured ones
    assert after["phases_s"]["host_wait"] == pytest.approx(79.0)
    assert after["trial_process_s"] == pytest.approx(before["trial_process_s"] + 350.0)
    # Its 350 s are inside its phases, bar the 0.5 s its account does not cover.
    assert after["outside_phases_s"] == pytest.approx(before["outside_phases_s"] + 0.5)
    what = [r["what"] for r in section.rows(after)]
    assert f"phase: first_call, unfinished ({after['trials']} trials)" in what
    # A trial with its own record is counted from it, whatever else it carries.
    doc["trials"][-1] = {**stopped, "phase_s": {"first_call": 300.0}}
    own = time_spent(doc, {"search": 150.0})
    assert "first_call, unfinished" not in own["phases_s"]
    assert own["phases_s"]["first_call"] == pytest.approx(before["phases_s"]["first_call"] + 300)


def test_stage_seconds_sum_repeated_marks_and_run_to_the_end():
    marks = [("environment", 1.0), ("search", 3.0), ("search", 7.0), ("select", 10.0)]
    got = stage_seconds(marks, start=0.0, end=12.0)
    assert got == {"setup": 1.0, "environment": 2.0, "search": 7.0, "select": 2.0}
    assert sum(got.values()) == pytest.approx(12.0)


def test_stage_clock_marks_and_passes_calls_through():
    seen = []

    class Events:
        def stage(self, name, detail, left):
            seen.append(("stage", name))

        def skipped(self, spec, why):
            seen.append(("skipped", spec))

    clock = StageClock(Events())
    clock.stage("search", "x", 10.0)
    clock.skipped("eager", "time")
    assert [m[0] for m in clock.marks] == ["search"]
    assert seen == [("stage", "search"), ("skipped", "eager")]


def test_report_renders_the_section():
    from torchkiln.report.render import html, markdown

    doc = minimal_tune_doc()
    for i, trial in enumerate(doc["trials"]):
        trial.pop("reused", None)
        trial["phase_s"] = {"setup": 10.0 + i, "first_call": 2.0}
    setup = sum(10.0 + i for i in range(len(doc["trials"])))
    n = len(doc["trials"]) + len(doc.get("head_to_head_trials", []))
    doc["time_spent"] = time_spent(doc, {"baseline": 20.0, "search": 70.0})
    md = markdown(doc)
    assert "## Where the time went" in md
    assert "| stage: search | 70.0 |" in md
    assert f"| phase: setup ({n} trials) | {setup:.1f} |" in md
    page = html(doc)
    assert "<h2>Where the time went</h2>" in page and f"phase: first_call ({n} trials)" in page


def test_older_results_without_time_spent_render_without_the_section():
    from torchkiln.report.render import markdown

    assert "Where the time went" not in markdown(minimal_tune_doc())
    assert section.sections({}) == [] and console_line(None) is None


def test_console_line_is_compact():
    spent = time_spent(synthetic_doc(), {"search": 150.0, "select": 0.1})
    line = console_line(spent)
    assert (
        line
        == "time spent: 200s (search 150s); over 4 trials: measure 40s, setup 28s, first_call 17s"
    )
    assert phase_seconds([])[1]["trials"] == 0


def minimal_tune_doc():
    return synthetic_tune_doc()


def test_stages_beside_the_main_line_are_overlap_not_added():
    spans = [("profile", 2.0, 5.0), ("graph breaks", 5.0, 12.0)]
    beside = beside_seconds(spans)
    assert beside == {"profile": 3.0, "graph breaks": 7.0}
    stages = stage_seconds([("baseline", 0.0), ("search", 2.0)], start=0.0, end=20.0)
    spent = time_spent({"wall_s": 20.0, "trials": []}, stages, beside)
    assert sum(spent["stages_s"].values()) == pytest.approx(spent["wall_s"])
    assert spent["beside_s"] == beside
    assert console_line(spent) == (
        "time spent: 20s (baseline 2s, search 18s; beside the search: profile 3s, graph breaks 7s)"
    )
    what = [r["what"] for r in section.rows(spent)]
    assert "stage: graph breaks (beside the search)" in what
    assert "beside_s" not in time_spent({"wall_s": 20.0}, stages)


def test_stage_clock_keeps_a_stage_beside_apart_even_when_it_fails():
    seen = []

    class Events:
        def stage(self, name, detail, left):
            seen.append(name)

    clock = StageClock(Events())
    with pytest.raises(RuntimeError), clock.beside("profile", "x", 1.0):
        raise RuntimeError("the profile failed")
    assert clock.marks == [] and [s[0] for s in clock.beside_spans] == ["profile"]
    assert seen == ["profile"]
