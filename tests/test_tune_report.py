"""Reports escape what came from users' code; compare tells regressions from noise."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests_helpers import synthetic_tune_doc
from torchkiln.report.render import html, markdown
from torchkiln.report.schema import validate


def test_html_escapes_source_lines_and_reasons():
    doc = synthetic_tune_doc()
    page = html(doc)
    assert "if x.sum() < 0:" not in page
    assert "if x.sum() &lt; 0:" in page
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert page.count("<svg") >= 4  # step time, compile vs speedup, cumulative, memory
    assert "http" not in page.split("<body>", 1)[1]  # nothing to fetch: one file, no network
    md = markdown(doc)
    assert "x.sum() &lt; 0" in md and "<script>" not in md


def test_the_report_says_which_candidates_ran_at_their_second_turn():
    doc = synthetic_tune_doc()
    search = doc["stages"]["search"]
    search["deferred"] = {
        "inductor": "would not fit the budget (estimated 36 s, 24 s left <reserve>)",
        "inductor:mode=max-autotune": "would not fit the budget (estimated 346 s, 24 s left)",
    }
    md = markdown(doc)
    assert (
        "- Deferred `inductor` at its first turn, run at its second: would not fit the budget "
        "(estimated 36 s, 24 s left &lt;reserve&gt;)"
    ) in md
    # Deferred, then skipped at its second turn: one line, the skip's.
    assert "Deferred `inductor:mode=max-autotune`" not in md
    assert "- Skipped `inductor:mode=max-autotune`: would not fit &lt;budget&gt;" in md


def test_the_opportunity_line_names_a_variant_other_than_the_pick():
    doc = synthetic_tune_doc()
    opp = {"variant": "inductor+bf16", "speedup": 3.1, "worst_error_over_threshold": 0.4,
           "passed": True}  # fmt: skip
    doc["selection"]["best_numerics_changing"] = opp
    assert "Opportunity: the best numerics-changing variant, `inductor+bf16`, gave 3.10x" in (
        markdown(doc)
    )
    # The pick itself is the best numerics-changing variant: its bullet already says so.
    doc["selection"]["best"] = "inductor+bf16"
    assert "Opportunity" not in markdown(doc)


def _bench_doc(ms, ci):
    return {
        "schema": "torchkiln.bench/1",
        "trials": [{"variant": "inductor", "steady_ms": {"median": ms, "ci95": list(ci)}}],
    }


def _kiln(*args):
    return subprocess.run(
        [sys.executable, "-m", "torchkiln.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_compare_exits_1_on_a_regression_and_0_on_noise(tmp_path):
    old, noisy, slow = tmp_path / "old.json", tmp_path / "noisy.json", tmp_path / "slow.json"
    old.write_text(json.dumps(_bench_doc(10.0, (9.9, 10.1))))
    noisy.write_text(json.dumps(_bench_doc(10.3, (9.8, 10.9))))  # +3%, intervals overlap
    slow.write_text(json.dumps(_bench_doc(12.0, (11.9, 12.1))))  # +20%, clear of the old
    ok = _kiln("compare", str(old), str(noisy))
    assert ok.returncode == 0, ok.stderr
    assert "no significant change" in ok.stdout
    bad = _kiln("compare", str(old), str(slow))
    assert bad.returncode == 1
    assert "regression" in bad.stdout
    missing = _kiln("compare", str(old), str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr


@pytest.mark.slow
def test_kiln_tune_simple_tiny_cpu_within_budget(tmp_path):
    """The README's main command as a user runs it on a CPU machine (default workload, preset
    and budget): it ends within 5 minutes on this repository's 2-core machines."""
    out = tmp_path / "tune"
    budget_s = 240  # `--budget auto` on the CPU
    t0 = time.monotonic()
    proc = _kiln_long("tune", "--device", "cpu", "--out", str(out))
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert elapsed < 300, elapsed
    assert json.loads((out / "results.json").read_text())["budget_s"] == budget_s
    for name in ("report.md", "report.html", "results.json"):
        assert (out / name).exists(), name
    doc = json.loads((out / "results.json").read_text())
    validate(doc)
    assert doc["wall_s"] <= budget_s  # trials stop early enough to leave time for the report
    assert doc["trials"][0]["variant"] == "eager"
    assert doc["selection"]["best"] is not None
    assert doc["recommendation"]["code"].startswith("import torch")
    assert doc["stages"]["graph_breaks"]["breaks"] == 0
    # The leader met its challengers head to head (or the report says why not).
    h2h = doc["stages"]["head_to_head"]
    assert h2h["leader"] is not None
    assert len(doc["head_to_head_trials"]) + len(h2h["skipped"]) >= 1
    for t in doc["head_to_head_trials"]:
        assert t["baseline"] == h2h["leader"] and t["status"] == "ok", t.get("reason")
        # Not checked again (its search trial was), and the note says so, not "--no-check".
        assert t["correctness"] is None
        assert "correctness check skipped (a head-to-head trial" in " ".join(t["notes"])
    # The leader was refined (simple is convolutional: channels_last stacked on it; an
    # inference leader may then get its weights frozen).
    refined = doc["stages"]["search"]["refined"]
    assert refined and any(r["spec"].endswith("+channels_last") for r in refined)
    assert all(
        r["spec"].endswith("+channels_last") or "freezing=true" in r["spec"] for r in refined
    )
    tried = {t["variant"] for t in doc["trials"]} | set(doc["stages"]["search"]["skipped"])
    assert all(r["spec"] in tried for r in refined)
    assert set(doc["selection"]["head_to_head"]) == {
        t["variant"] for t in doc["head_to_head_trials"]
    }
    assert "Head to head" in (out / "report.md").read_text()
    rerender = _kiln("report", str(out))
    assert rerender.returncode == 0


def _kiln_long(*args):
    return subprocess.run(
        [sys.executable, "-m", "torchkiln.cli", *args], capture_output=True, text=True, timeout=900
    )


def test_inductor_vs_xla_section_when_both_ran():
    doc = synthetic_tune_doc()
    assert "Inductor vs XLA" not in markdown(doc)
    xla = dict(doc["trials"][1], variant="xla", first_call_s=6.8)
    xla["memory"] = {"jax_peak_bytes_in_use": 3 * 2**30}
    xla["xla"] = {"shape_recompiles": [{"recompiled": True}, {"recompiled": False}]}
    doc["trials"].append(xla)
    md = markdown(doc)
    assert "## Inductor vs XLA" in md
    assert "3.00 GiB (JAX peak)" in md and "1 of 2 new shapes recompiled" in md
    assert "Inductor vs XLA" in html(doc)
