"""Every sentence the report prints is generated from the measurement it describes."""

from __future__ import annotations

from tests_helpers import synthetic_tune_doc
from torchkiln.report.evidence import distinct_breaks, html_inline, md_inline
from torchkiln.report.render import html, markdown
from torchkiln.tune.limits import does_not_fit
from torchkiln.tune.recommend import reasons


def _best(variant):
    return {
        "variant": variant,
        "speedup": {"median": 1.5, "ci95": [1.4, 1.6]},
        "steady_ms": {"median": 2.0},
        "baseline_ms": {"median": 3.0},
        "first_call_s": 30.0,
        "kernels_per_step": 40,
        "baseline_kernels_per_step": 120,
    }


def test_cuda_graphs_replay_the_whole_step_in_one_launch_only_with_one_graph_and_no_break():
    best, eager = _best("inductor:mode=reduce-overhead"), {}
    one = " ".join(reasons(best, eager, {"breaks": 0, "graphs": 1}))
    assert "CUDA graphs replay the whole step with one launch" in one
    four = " ".join(reasons(best, eager, {"breaks": 4, "graphs": 3}))
    assert "whole step" not in four and "one graph" not in four
    assert "each of the 3 captured graphs with one launch" in four
    assert "4 graph breaks" in four
    unknown = " ".join(reasons(best, eager, {"status": "error", "breaks": None}))
    assert "whole step" not in unknown and "not measured" in unknown


def test_eager_kept_because_nothing_else_finished_says_so():
    eager = _best("eager")
    alone = " ".join(reasons(eager, eager, None, others_passed=0))
    assert "no compiled variant finished and passed the check" in alone
    assert "faster" not in alone
    beaten = " ".join(reasons(eager, eager, None, others_passed=3))
    assert "no compiled variant was faster" in beaten


def test_a_budget_skip_never_reads_a_negative_time_left():
    assert "-28 s" not in does_not_fit(40, -28, "the report")
    assert "estimated 40 s, 0 s left after the time kept for the report" in does_not_fit(
        40, -28, "the report"
    )
    assert "12 s left" in does_not_fit(40, 12.2, "the report")


def test_a_break_found_twice_at_one_line_is_listed_once_with_its_count():
    doc = synthetic_tune_doc()
    gb = doc["stages"]["graph_breaks"]
    site = dict(gb["first_breaks"][0])
    gb["first_breaks"] = [site, dict(site), {**site, "line": 30}]
    md = markdown(doc)
    assert md.count("model.py:12 ") == 1
    assert "model.py:12 data-dependent control flow (found 2 times)" in md
    assert md.count("model.py:30 ") == 1 and "model.py:30 data-dependent control flow:" in md
    assert [b["count"] for b in distinct_breaks(gb["first_breaks"])] == [2, 1]


def test_code_spans_keep_user_text_literal_and_the_captured_share_is_a_percentage():
    doc = synthetic_tune_doc()
    gb = doc["stages"]["graph_breaks"]
    gb["captured_share"] = 0.8888888888888888
    gb["first_breaks"][0]["fix"] = "replace `x.sum() > 0` by torch.where"
    md = markdown(doc)
    assert "`x.sum() > 0`" in md and "x.sum() &gt; 0" not in md
    assert "captured share: 88.9%" in md and "0.888" not in md
    # Outside a code span, user text still cannot become HTML.
    assert md_inline("a <b> `<c>`") == "a &lt;b&gt; `<c>`"
    assert html_inline("a <b> `<c>`") == "a &lt;b&gt; <code>&lt;c&gt;</code>"
    page = html(doc)
    assert "<code>x.sum() &gt; 0</code>" in page and "88.9%" in page


def test_missing_evidence_reads_not_measured_with_the_reason():
    doc = synthetic_tune_doc()
    doc["stages"]["graph_breaks"] = {"status": "error", "reason": "RuntimeError: boom"}
    doc["stages"]["profile"] = {}
    md = markdown(doc)
    assert "None" not in md.split("## Evidence", 1)[1]
    assert "Graph breaks: not measured (RuntimeError: boom)" in md
    assert "Profile verdict: not measured (the stage did not run)" in md


def test_the_html_page_has_the_environment_line_and_evidence_as_html():
    doc = synthetic_tune_doc()
    page = html(doc)
    assert "x86_64 · torch 2.x · triton None · kiln abc · budget 300 s, used 100 s" in page
    assert "<h2>Evidence</h2><ul" in page and "<pre>- " not in page
    assert "<code>inductor:mode=max-autotune</code>" in page  # a code span, not backticks


def test_without_matplotlib_the_page_draws_simpler_charts_and_names_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name)
    )
    page = html(synthetic_tune_doc())
    assert "pip install &#x27;torchkiln[report]&#x27;" in page
    assert page.count("<svg") >= 4


def test_with_matplotlib_the_charts_have_ticks_and_unique_clip_paths():
    import re

    import pytest

    pytest.importorskip("matplotlib")
    page = html(synthetic_tune_doc())
    assert "torchkiln[report]" not in page
    assert page.count('id="xtick_1"') >= 4  # matplotlib's tick marks, on every chart
    clips = re.findall(r'<clipPath id="([^"]+)"', page)
    assert clips and len(clips) == len(set(clips))  # inline charts never share a clip path


def test_the_tie_list_shows_in_both_reports():
    doc = synthetic_tune_doc()
    doc["selection"]["tied"] = ["inductor", "eager"]
    assert "Tied (overlapping intervals): `inductor`, `eager`" in markdown(doc)
    assert "Tied (overlapping intervals): <code>inductor</code>, <code>eager</code>" in html(doc)


def test_the_hand_drawn_bars_make_room_for_long_variant_names():
    import re

    from torchkiln.report import svg

    name = "inductor:mode=reduce-overhead,fullgraph=true,dynamic=false,freezing=true+bf16"
    chart = svg.hbars("t", [(name, 1.0, None), ("eager", 2.0, None)], "ms")
    label_x = float(re.search(r'<text x="([\d.]+)" y="\d+" text-anchor="end">', chart)[1])
    assert label_x >= 6.5 * len(name)  # right-aligned at x: the whole name fits left of it
    assert f'width="{int(6.5 * len(name)) + 12 + 460}"' in chart


def test_the_tune_console_never_prints_a_negative_time_left():
    import io

    from rich.console import Console

    from torchkiln.cli import _TuneProgress

    buf = io.StringIO()
    progress = _TuneProgress(Console(file=buf, width=200))
    progress.stage("report", "writing", -28.4)
    progress.trial_phase("inductor", "measure", -3.0)
    text = buf.getvalue()
    assert "-28" not in text and "-3 s" not in text
    assert "past the budget by 28 s" in text and "past the budget by 3 s" in text
