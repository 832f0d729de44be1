"""`kiln explain` end to end: each test runs the real worker process over a tiny fixture model."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from torchkiln.diagnose import explain as explain_cmd
from torchkiln.diagnose.explain import exit_code, explain
from torchkiln.errors import KilnUserError

FIXTURES = Path(__file__).parent / "fixtures"
FOUR = f"{FIXTURES / 'four_breaks.py'}:build"
CLEAN = f"{FIXTURES / 'clean.py'}:build"
MISBEHAVING = FIXTURES / "misbehaving.py"


def _marked_lines(path: Path) -> list[tuple[int, str]]:
    """(line, category) for every `# BREAK <category>` marker in a fixture."""
    lines = path.read_text().splitlines()
    return [
        (i, m.group(1))
        for i, text in enumerate(lines, 1)
        if (m := re.search(r"# BREAK ([\w-]+)", text))
    ]


@pytest.fixture(scope="module")
def four_breaks() -> dict:
    # on the CPU wherever it runs: the fixture hands its tensor to numpy, as CPU code does (on
    # a GPU machine explain's default device is the GPU, where .numpy() raises)
    return explain(FOUR, recompiles=False, timeout=300, device="cpu")


@pytest.fixture(scope="module")
def clean_over_batches() -> dict:
    return explain(CLEAN, batch_sizes=[2, 3, 4], timeout=300)


def test_four_known_breaks_at_their_lines_with_their_categories(four_breaks: dict) -> None:
    expected = _marked_lines(FIXTURES / "four_breaks.py")
    assert [c for _, c in expected] == [
        "tensor-to-scalar",
        "print-logging",
        "third-party-call",
        "tensor-assert",
    ]
    assert four_breaks["status"] == "ok", four_breaks.get("error")
    found = [(b["line"], b["category"]) for b in four_breaks["breaks"]]
    assert found == expected
    for b in four_breaks["breaks"]:
        assert b["file"] == str(FIXTURES / "four_breaks.py")
        assert b["source"] and "# BREAK" in b["source"]
        assert b["fix"] and b["reason"]
        # Graph-break ids and links exist from torch 2.8 on; when present they are well formed.
        assert b["gb_id"] is None or re.fullmatch(r"GB\d{4}", b["gb_id"])
        assert b["doc_url"] is None or b["doc_url"].startswith("https://")


def test_graphs_ops_and_captured_share(four_breaks: dict) -> None:
    graphs = four_breaks["graphs"]
    # Four breaks split the forward into five graphs, each with at least one op.
    assert graphs["count"] == 5
    assert all(g["ops"] >= 1 for g in graphs["per_graph"])
    assert 0 < graphs["captured_aten_ops"] <= graphs["eager_aten_ops"]
    assert 0.0 < graphs["captured_share"] < 1.0


def test_break_free_model_reports_zero_breaks(clean_over_batches: dict) -> None:
    assert clean_over_batches["status"] == "ok", clean_over_batches.get("error")
    assert clean_over_batches["breaks"] == []
    assert clean_over_batches["graphs"]["count"] == 1
    assert clean_over_batches["graphs"]["captured_share"] == 1.0


def test_batch_sizes_2_3_4_report_the_recompilation_and_its_guard(clean_over_batches: dict) -> None:
    rec = clean_over_batches["recompiles"]
    assert rec["source"] == "batch sizes 2,3,4"
    # Batch 3 fails the static batch-2 guard; Dynamo then marks the dim dynamic, so 4 reuses it.
    assert rec["count"] == 1
    (r,) = rec["recompilations"]
    assert r["trigger"] == "batch 3"
    assert r["function"] == "forward"
    assert "size mismatch at index 0" in r["reason"]
    assert "expected 2, actual 3" in r["reason"]
    assert "mark_dynamic" in r["fix"]
    assert rec["limit_hit"] is False and rec["warning"] is None


def test_input_stream_recompiles_and_reduce_overhead_cuda_graphs() -> None:
    import torch

    report = explain(
        f"{FIXTURES / 'clean.py'}:streamed", variant="inductor:mode=reduce-overhead", timeout=300
    )
    rec = report["recompiles"]
    assert rec["source"] == "input stream"  # no --batch-sizes: the workload's own stream
    assert [s["shapes"] for s in rec["steps"]] == [[[2, 8]], [[3, 8]], [[4, 8]]]
    assert rec["count"] == 1 and "expected 2, actual 3" in rec["recompilations"][0]["reason"]
    assert "note" not in rec
    cg = report["cudagraphs"]
    assert cg["mode"] == "reduce-overhead"
    if torch.cuda.is_available():
        assert cg["status"] in ("ok", "skipped")
        assert all(s["reason"] and s["fix"] for s in cg["skips"])
    else:
        assert cg["status"] == "not-applicable" and "CUDA" in cg["note"]


def test_recompile_limit_warns_that_calls_fall_back_to_eager() -> None:
    report = explain(
        CLEAN,
        variant="inductor:dynamic=false",
        batch_sizes=[2, 3, 4, 5],
        recompile_limit=2,
        timeout=300,
    )
    rec = report["recompiles"]
    # Static shapes, limit 2: batch 2 compiles, batch 3 recompiles, batch 4 would be the third
    # entry, so Dynamo refuses and runs it (and every later new size) in eager.
    assert rec["count"] == 1 and rec["fallbacks"] == 1
    assert [(r["trigger"], r["fell_back_to_eager"]) for r in rec["recompilations"]] == [
        ("batch 3", False),
        ("batch 4", True),
    ]
    assert rec["limit_hit"] is True
    assert "recompile limit (2)" in rec["warning"] and "eager" in rec["warning"]
    assert "at batch 4" in rec["warning"]


def test_cli_fullgraph_check_json_and_trace(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    parser = argparse.ArgumentParser()
    explain_cmd.add_arguments(parser)
    out = tmp_path / "explain.json"
    trace = tmp_path / "trace"
    args = parser.parse_args(
        [FOUR, "--no-recompiles", "--fullgraph-check", "--json", str(out), "--trace", str(trace),
         "--device", "cpu"]
    )  # fmt: skip
    assert explain_cmd.run(args) == 1  # four breaks: the CI check fails
    text = capsys.readouterr().out
    assert 'print("halfway")' in text and "fix:" in text and "fullgraph check: FAIL" in text
    report = json.loads(out.read_text())
    assert len(report["breaks"]) == 4 and report["fullgraph_check"] == "fail"
    assert report["trace"]["log_files"], "TORCH_TRACE wrote no structured log"
    assert report["trace"]["tlparse"]["status"] in ("ok", "not-installed")

    args = parser.parse_args([CLEAN, "--no-recompiles", "--fullgraph-check", "--json", "-"])
    assert explain_cmd.run(args) == 0
    assert json.loads(capsys.readouterr().out)["fullgraph_check"] == "pass"


def test_worker_timeout_is_a_status_not_a_hang() -> None:
    report = explain(f"{MISBEHAVING}:sleepy", timeout=5)
    assert report["status"] == "timeout"
    assert "did not finish within 5 s" in report["error"]
    assert exit_code(report, fullgraph_check=False) == 1


def test_worker_crash_is_a_status_not_a_traceback() -> None:
    report = explain(f"{MISBEHAVING}:exits", timeout=120)
    assert report["status"] == "crashed"
    assert "exited with code 3" in report["error"]


def test_model_error_is_reported_per_phase() -> None:
    report = explain(f"{MISBEHAVING}:raises_in_forward", recompiles=False, timeout=120)
    assert report["status"] == "phase-error"
    assert report["phases"]["capture"]["status"] == "error"
    assert "forward is broken on purpose" in report["phases"]["capture"]["error"]


def test_unknown_workload_or_variant_is_a_user_error() -> None:
    with pytest.raises(KilnUserError, match="unknown workload"):
        explain("no-such-workload", timeout=120)
    with pytest.raises(KilnUserError, match="choose from"):
        explain(CLEAN, variant="inductor:mode=fastest", timeout=120)


def test_size_guards_name_the_callers_input_and_dim_in_the_fix():
    from torchkiln.diagnose.recompiles import _fix_for, guards_summary

    # a keyword input (a Hugging Face model's): its name holds quotes of its own
    guard = "tensor 'kwargs['input_ids']' size mismatch at index 1. expected 71, actual 58"
    fix = _fix_for(guard)
    assert "Mark dim 1 of `input_ids` dynamic" in fix
    assert "`torch._dynamo.mark_dynamic(input_ids, 1)`" in fix
    assert "`torch._dynamo.mark_dynamic(x, 0)`" in _fix_for(
        "tensor 'L['x']' size mismatch at index 0. expected 2, actual 3"
    )
    # a source that is no name a caller holds: no call written out, the source named
    fix = _fix_for("tensor 'L['self'].buf' size mismatch at index 0. expected 2, actual 3")
    assert "of `L['self'].buf`" in fix and "mark_dynamic(" not in fix
    rec = {"function": "forward", "reason": guard, "fell_back_to_eager": False}
    (g,) = guards_summary([rec, {**rec, "reason": guard.replace("58", "60")}])
    assert (g["input"], g["dim"], g["count"]) == ("input_ids", 1, 2)
