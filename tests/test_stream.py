"""Streams: trace parsing errors case by case, and a replay's compiler counters on a tiny model."""

from __future__ import annotations

import json

import pytest
import torch

from torchkiln.errors import KilnUserError
from torchkiln.measure.stream_replay import replay
from torchkiln.workloads.stream import Stream


def _make(batch: int, seq: int) -> tuple[torch.Tensor]:
    return (torch.randn(batch, seq, 8),)


def _trace(tmp_path, lines: list[str]):
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_trace_builds_items_in_order(tmp_path):
    p = _trace(tmp_path, ['{"batch": 2, "seq": 3}', "", '{"batch": 1, "seq": 5}'])
    s = Stream.from_trace(p, _make)
    assert [x[0].shape for x in s] == [(2, 3, 8), (1, 5, 8)]
    assert s.where(1) == f"{p}:3"


@pytest.mark.parametrize(
    ("lines", "needle"),
    [
        (['{"batch": 2, "seq": 3}', '{"batch": 2}'], ":2:"),  # a missing size
        (['{"batch": 2, "seq": -3}'], ":1: sizes must be positive"),
        (['{"batch": 2, "seq": 900}'], ":1: seq=900 is beyond what the model accepts"),
        (["not json"], ":1: not JSON"),
        (['{"batch": 2, "len": 3}'], ":1: sizes {'batch': 2, 'len': 3} do not fit"),
        (["", "  "], "is empty"),
    ],
)
def test_trace_errors_name_the_line(tmp_path, lines, needle):
    p = _trace(tmp_path, lines)
    with pytest.raises(KilnUserError, match=None) as err:
        Stream.from_trace(p, _make, limits={"seq": 512})
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_required_symbol_missing(tmp_path):
    p = _trace(tmp_path, ['{"batch": 2}'])
    with pytest.raises(KilnUserError, match=r":1: missing size\(s\) \['seq'\]"):
        Stream.from_trace(p, lambda batch, seq=4: _make(batch, seq), required=["seq"])


def test_empty_stream():
    with pytest.raises(KilnUserError, match="empty"):
        Stream.from_items([])


def test_input_that_does_not_fit_names_the_item():
    s = Stream.from_items([(torch.randn(2, 8),), (torch.randn(2, 7),)])
    m = torch.nn.Linear(8, 4)
    with pytest.raises(KilnUserError, match="stream item 2: the input does not fit the model"):
        replay(m, m, s)


def test_static_compile_recompiles_per_shape_and_matches_eager():
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    sizes = [{"batch": 1, "seq": n} for n in (3, 5, 3, 7, 5, 7, 3)]
    s = Stream.from_sizes(_make, sizes)
    compiled = torch.compile(m, dynamic=False, backend="eager")
    r = replay(compiled, m, s, check=lambda a, b: torch.allclose(a, b, atol=1e-5))
    assert r["distinct_shapes"] == 3
    # dynamo compiles one graph per distinct static shape: the first plus one recompile each
    assert r["compiles"] == 3
    assert r["recompiles"] == 2
    assert r["eager_fallbacks"] == 0
    assert r["mismatched_items"] == []
    assert r["cudagraph_recordings"] in (0, None)  # no CUDA graphs on CPU
    assert r["items"] == 7
    assert r["compile_time_s"] is None or r["compile_time_s"] > 0


def test_steady_items_split_by_whether_their_shape_was_seen_before():
    torch._dynamo.reset()
    m = torch.nn.Linear(8, 4).eval()
    # warm-up: the first 4 items (3, 5, 3, 5); after it 7, 9 and 11 are new to the replay,
    # 3, 5 and the second 7 were seen before
    seqs = (3, 5, 3, 5, 7, 3, 9, 5, 7, 11)
    s = Stream.from_sizes(_make, [{"batch": 1, "seq": n} for n in seqs])
    compiled = torch.compile(m, dynamic=False, backend="eager")
    r = replay(compiled, m, s, warmup_fraction=0.4)
    assert r["warmup_items"] == 4
    assert r["steady_first_seen_items"] == 3
    assert r["steady_seen_items"] == 3
    # the two parts are the steady seconds, split
    steady_s = r["steady_time_per_item_s"] * (r["items"] - r["warmup_items"])
    assert r["steady_first_seen_s"] + r["steady_seen_s"] == pytest.approx(steady_s)
    # and eager's seconds on the same items, split alike
    eager_s = r["eager_steady_time_per_item_s"] * (r["items"] - r["warmup_items"])
    assert r["steady_first_seen_eager_s"] + r["steady_seen_eager_s"] == pytest.approx(eager_s)
    assert r["steady_first_seen_eager_s"] > 0 and r["steady_seen_eager_s"] > 0
    # one static graph per new shape, each compiled after warm-up
    assert r["steady_compiles"] == 3
    assert r["compiles"] == 5
    assert r["steady_cudagraph_recordings"] in (0, None)


def test_the_steady_part_is_announced_once_before_its_first_item():
    """``on_steady`` (where a trial in flight with others takes the host alone) is called once,
    after the warm-up items and before the first steady item runs."""
    seen: list[str] = []

    def model(x):
        seen.append(f"call {x.shape[1]}")
        return x * 2

    s = Stream.from_sizes(_make, [{"batch": 1, "seq": n} for n in (3, 4, 5, 6, 7)])
    replay(model, model, s, warmup_fraction=0.4, on_steady=lambda: seen.append("steady"))
    # the untimed prime on item 0, then each item twice (eager, candidate); steady before 5
    assert seen == ["call 3", *[f"call {n}" for n in (3, 3, 4, 4)], "steady",
                    *[f"call {n}" for n in (5, 5, 6, 6, 7, 7)]]  # fmt: skip


def _kiln(*argv: str):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    return subprocess.run(
        [sys.executable, "-m", "torchkiln.cli", *argv], capture_output=True, text=True, env=env
    )


def test_bench_stream_end_to_end(tmp_path):
    trace = _trace(tmp_path, ['{"batch": 2, "side": 24}', '{"batch": 1, "side": 32}'])
    out = tmp_path / "run"
    common = ("bench", "simple", "--preset", "tiny", "--device", "cpu", "--variants", "eager")
    r = _kiln(*common, "--stream", str(trace), "--out", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads((out / "stream.json").read_text())
    (t,) = doc["trials"]
    assert t["status"] == "ok" and t["items"] == 2 and t["distinct_shapes"] == 2
    assert t["mismatched_items"] == []
    # a bad trace: exit 2, one line naming the line, the earlier run's results untouched
    before = (out / "stream.json").read_text()
    bad = _trace(tmp_path, ['{"batch": 2, "side": 24}', '{"batch": 0, "side": 24}'])
    r = _kiln(*common, "--stream", str(bad), "--out", str(out))
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and f"{bad}:2:" in r.stderr
    assert (out / "stream.json").read_text() == before


FACTORY = """
import torch
from torchkiln import Workload


def make():
    return Workload(
        model=torch.nn.Linear(8, 4),
        example_inputs=(torch.randn(2, 8),),
        make_inputs=lambda batch, feat: (torch.randn(batch, feat),),
    )
"""


def test_bench_stream_input_the_model_refuses(tmp_path):
    # the maker accepts any feature size; the model takes 8 features only
    (tmp_path / "tiny_linear.py").write_text(FACTORY)
    trace = _trace(tmp_path, ['{"batch": 1, "feat": 8}', '{"batch": 2, "feat": 5}'])
    r = _kiln(
        "bench",
        f"{tmp_path / 'tiny_linear.py'}:make",
        "--device",
        "cpu",
        "--variants",
        "eager",
        "--stream",
        str(trace),
        "--out",
        str(tmp_path / "run"),
    )
    assert r.returncode == 2, r.stderr
    assert f"{trace}:2: the input does not fit the model" in r.stderr
    assert r.stderr.strip().count("\n") == 0
    assert not (tmp_path / "run").exists()


def test_simple_default_stream_mixes_three_resolutions():
    from torchkiln.workloads.loader import load_workload
    from torchkiln.workloads.stream import workload_stream

    s = workload_stream(load_workload("simple", preset="tiny"), length=30)
    assert len(s) == 30
    assert {x[0].shape[-1] for x in s} == {24, 32, 40}


def test_gpt2_default_stream_varies_the_sequence_at_the_preset_batch():
    pytest.importorskip("transformers")
    from torchkiln.workloads.loader import load_workload
    from torchkiln.workloads.stream import workload_stream

    w = load_workload("gpt2", preset="tiny")
    assert w.model.config.use_cache is False  # logits alone, as the fixed-input workload
    limit = w.size_limits["seq"]
    assert limit == w.model.config.n_positions
    s = workload_stream(w, None, 40)
    assert len(s) == 40
    assert {x["batch"] for x in s.sizes} == {2}
    seqs = [x["seq"] for x in s.sizes]
    assert len(set(seqs)) > 10 and max(seqs) <= limit
    assert s.items[0]["input_ids"].shape == (2, seqs[0])
    w.model.eval()
    with torch.no_grad():
        out = w.model(**s.items[0])
    assert out.logits.shape == (2, seqs[0], w.model.config.vocab_size)
    assert getattr(out, "past_key_values", None) is None


def test_bench_table_aligns_long_variants_and_counts_warm_up_compiles_apart(capsys):
    from torchkiln.cli_stream import _render

    row = {"status": "ok", "time_per_item_s": 0.2, "steady_time_per_item_s": 0.1, "p99_s": 0.3,
           "speedup": 1.0, "steady_speedup": 1.1, "compiles": 0, "eager_fallbacks": 0}  # fmt: skip
    long = "inductor:dynamic=false+bucket=pow2"
    doc = {"workload": "w", "items": 10, "device": "cpu", "step": "infer", "trials": [
        {**row, "variant": "eager"},
        {**row, "variant": long, "warmup_compiles": 6},
        {"variant": "inductor", "status": "timeout", "error": "past its cap"},
    ]}  # fmt: skip
    _render(doc)
    lines = capsys.readouterr().out.splitlines()
    head, eager, bucketed, stopped = lines[1:5]
    # every column (right-aligned) ends where its header does, whatever the variant's length
    end = head.index("status") + len("status")
    assert eager.index(" ok ") + 3 == bucketed.index(" ok ") + 3 == end
    assert stopped.index("timeout") + len("timeout") == end
    assert head.endswith("fallbacks") and len(head) == len(eager) == len(bucketed)
    # the bucketed candidate's 6 warm-up compiles are shown apart from the replay's 0
    assert bucketed.split()[-2] == "6+0" and eager.split()[-2] == "0"
    assert lines[5].startswith("compiles W+R:")
