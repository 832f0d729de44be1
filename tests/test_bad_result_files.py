"""`kiln report` and `kiln compare` on files that are not kiln results: exit 2 and one line
naming the file and what is wrong, never a traceback."""

from __future__ import annotations

import json

import pytest

from tests_helpers import synthetic_tune_doc
from torchkiln.cli import main


def _truncated() -> str:
    text = json.dumps(synthetic_tune_doc())
    return text[: len(text) // 2]


def _without(key: str) -> str:
    doc = synthetic_tune_doc()
    del doc[key]
    return json.dumps(doc)


def _trial_without_variant() -> str:
    doc = synthetic_tune_doc()
    del doc["trials"][1]["variant"]
    return json.dumps(doc)


def _bad_steady_ms() -> str:
    doc = synthetic_tune_doc()
    doc["trials"][1]["steady_ms"] = {"median": "fast"}
    return json.dumps(doc)


CASES = [
    ("truncated", _truncated(), "not JSON (truncated?)"),
    ("empty", "", "empty"),
    ("a list", "[1, 2, 3]", "holds a list, not a kiln result object"),
    ("a bare number", "42", "holds a number, not a kiln result object"),
    ("a string", '"results"', "holds a string"),
    ("trials not a list", '{"trials": "none"}', "its trials are a string, not a list"),
    ("no trials", '{"workload": "w"}', "has no trials"),
    ("a trial not an object", '{"trials": [1]}', "trials[0] is a number, not an object"),
    ("a trial without its variant", _trial_without_variant(), "trials[1] has no variant name"),
    ("steady_ms malformed", _bad_steady_ms(), "steady_ms is not {median, ci95: [lo, hi]}"),
]
# The report needs a tune's own fields as well.
REPORT_ONLY = [
    ("missing workload", _without("workload"), "workload is missing: not a kiln tune result"),
    ("missing budget", _without("budget_s"), "budget_s is missing"),
]


def _one_error_line(capsys, path, what):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("kiln: error: ") and str(path) in err and what in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("name,text,what", CASES + REPORT_ONLY, ids=lambda c: str(c)[:30])
def test_report_refuses_a_malformed_results_json_in_one_line(tmp_path, capsys, name, text, what):
    (tmp_path / "results.json").write_text(text)
    assert main(["report", str(tmp_path)]) == 2
    _one_error_line(capsys, tmp_path / "results.json", what)
    assert not (tmp_path / "report.html").exists()  # nothing half-written


@pytest.mark.parametrize("name,text,what", CASES, ids=lambda c: str(c)[:30])
def test_compare_refuses_a_malformed_file_in_one_line(tmp_path, capsys, name, text, what):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(synthetic_tune_doc()))
    bad.write_text(text)
    assert main(["compare", str(good), str(bad)]) == 2
    _one_error_line(capsys, bad, what)
    assert main(["compare", str(bad), str(good)]) == 2
    _one_error_line(capsys, bad, what)


def test_report_of_a_good_file_still_renders(tmp_path, capsys):
    (tmp_path / "results.json").write_text(json.dumps(synthetic_tune_doc()))
    assert main(["report", str(tmp_path)]) == 0
    assert (tmp_path / "report.html").exists() and (tmp_path / "report.md").exists()


def _bench(*trials):
    return json.dumps(
        {
            "schema": "torchkiln.bench/1",
            "trials": [
                {"variant": v, "steady_ms": {"median": ms, "ci95": [ms * 0.99, ms * 1.01]}}
                for v, ms in trials
            ],
        }
    )


def test_compare_reads_old_over_new_and_lists_variants_in_one_file_only(tmp_path, capsys):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(_bench(("inductor", 10.0), ("eager", 20.0), ("cudagraphs", 5.0)))
    new.write_text(_bench(("inductor", 5.0), ("eager", 20.0), ("inductor+bf16", 3.0)))
    assert main(["compare", str(old), str(new)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "speedup (old/new, >1 = faster)" in out[0]
    inductor = next(s for s in out if s.startswith("inductor "))
    assert "2.000x" in inductor and "improvement" in inductor  # twice as fast reads 2x
    assert "only in OLD (not compared): cudagraphs" in out
    assert "only in NEW (not compared): inductor+bf16" in out
