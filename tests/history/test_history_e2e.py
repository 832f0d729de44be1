"""Real benches append to the history; a store kiln cannot write costs a warning, never the
measurement; the tune report draws the trend of earlier comparable runs."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from history_docs import bench_doc
from tests_helpers import synthetic_tune_doc
from torchkiln.history.store import Store
from torchkiln.report.render import html


def kiln(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchkiln.cli", *args], capture_output=True, text=True, timeout=600
    )


BENCH = ["bench", "simple", "--preset", "tiny", "--device", "cpu", "--variants", "eager",
         "--reps", "3", "--rep-ms", "5", "--no-check"]  # fmt: skip


@pytest.mark.slow
def test_two_benches_are_appended_and_listed(tmp_path):
    store = tmp_path / "h.sqlite"
    for i in range(2):
        proc = kiln(*BENCH, "--out", str(tmp_path / f"run{i}"), "--history", str(store))
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"history: run {i + 1} appended to {store}" in proc.stderr
    listed = kiln("history", "simple", "--history", str(store), "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["run_id"], r["variant"], r["status"]) for r in rows] == [
        (2, "eager", "ok"),
        (1, "eager", "ok"),
    ]
    with Store(store) as s:
        stored = s.document(1)
    on_disk = json.loads((tmp_path / "run0" / "bench.json").read_text())
    assert stored["trials"] == on_disk["trials"]
    assert rows[1]["median_ms"] == on_disk["trials"][0]["steady_ms"]["median"]
    # The second run against the first: same workload, variant, device and precision.
    compared = kiln("compare", "--against", "history", "--history", str(store),
                    str(tmp_path / "run1"))  # fmt: skip
    assert compared.returncode in (0, 1), compared.stderr
    assert "against run 1" in compared.stdout


@pytest.mark.slow
def test_a_store_kiln_cannot_use_is_a_warning_and_the_bench_still_succeeds(tmp_path):
    store = tmp_path / "h.sqlite"
    store.write_bytes(b"someone else's file\n" * 100)
    digest = hashlib.sha256(store.read_bytes()).hexdigest()
    proc = kiln(*BENCH, "--out", str(tmp_path / "run"), "--history", str(store))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "kiln: warning: history not written" in proc.stderr
    assert "is not an SQLite database" in proc.stderr
    assert json.loads((tmp_path / "run" / "bench.json").read_text())["trials"][0]["status"] == "ok"
    assert hashlib.sha256(store.read_bytes()).hexdigest() == digest


def test_no_history_turns_the_store_off_and_history_picks_one():
    from torchkiln.cli import build_parser
    from torchkiln.history import from_args

    parse = build_parser().parse_args
    assert from_args(parse(["bench", "simple", "--no-history"])) is False
    assert from_args(parse(["tune", "simple", "--history", "h.sqlite"])) == "h.sqlite"
    assert from_args(parse(["serve-bench", "simple", "--trace", "t.jsonl"])) is None
    assert from_args(parse(["kernels", "bench", "--no-history"])) is False


def _tune(medians, created, torch="2.14.1"):
    doc = synthetic_tune_doc()
    doc["created"] = created
    doc["preset"] = "tiny"
    doc["environment"] = {**bench_doc({})["environment"], "torch": torch}
    for t in doc["trials"]:
        if t["variant"] in medians:
            ms = medians[t["variant"]]
            t["steady_ms"] = {"median": ms, "ci95": [ms * 0.98, ms * 1.02]}
    return doc


def test_the_tune_report_draws_the_trend_with_environment_changes_marked(tmp_path):
    store = tmp_path / "h.sqlite"
    first = _tune({"eager": 10.0}, "2026-11-01T10:00:00+0000", torch="2.13.0")
    assert "Trend" not in html(first, store)  # no store yet
    with Store(store) as s:
        s.append(first, "tune")
        s.append(_tune({"eager": 10.2}, "2026-11-02T10:00:00+0000"), "tune")
    now = _tune({"eager": 9.0}, "2026-11-03T10:00:00+0000")
    page = html(now, store)
    assert "Trend (history store" in page
    assert "eager: median step time over runs" in page
    assert "environment changed: torch 2.13.0→2.14.1" in page
    assert page.count("<circle") >= 3
    assert "Trend" not in html(now)  # history off: the report as before
    other = _tune({"eager": 9.0}, "2026-11-03T10:00:00+0000")
    other["workload"] = "another"
    assert "Trend" not in html(other, store)  # no earlier comparable run


def test_the_ci_example_runs_kiln_commands_that_parse_and_caches_the_store():
    import re
    import shlex
    from pathlib import Path

    from torchkiln.cli import build_parser

    text = (Path(__file__).parents[2] / "examples" / "github-actions-kiln.yml").read_text()
    joined = re.sub(r"\\\n\s*", "", text)
    commands = [line.strip() for line in joined.splitlines() if line.strip().startswith("kiln ")]
    commands += [
        line.split("run:", 1)[1].strip() for line in joined.splitlines() if "run: kiln " in line
    ]
    assert any(c.startswith("kiln bench") for c in commands)
    assert any("compare --against history" in c for c in commands)
    for command in commands:
        build_parser().parse_args(shlex.split(command)[1:])  # exits 2 on a bad option
    assert "actions/cache/restore" in text and "actions/cache/save" in text
    assert "KILN_HISTORY" in text
