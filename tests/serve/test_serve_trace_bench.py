"""Request traces (generator, JSONL) and `kiln serve-bench` end to end on a tiny BERT."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from torchkiln.errors import KilnUserError
from torchkiln.serve import bench, generate_trace, read_trace, write_trace


def tiny_bert_workload():
    """A workload factory for `kiln serve-bench tests/serve/test_serve_trace_bench.py:...`."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=512,
    )
    model = transformers.BertForSequenceClassification(cfg)
    inputs = {
        "input_ids": torch.randint(1, 100, (2, 8)),
        "attention_mask": torch.ones(2, 8, dtype=torch.long),
    }
    return model, inputs


def test_generated_traces_are_long_tailed_bounded_and_reproducible():
    trace = generate_trace(4000, seed=0)
    assert trace == generate_trace(4000, seed=0)
    assert trace != generate_trace(4000, seed=1)
    seq = np.array([r["seq"] for r in trace])
    batch = np.array([r["batch"] for r in trace])
    assert seq.min() >= 8 and seq.max() == 512 and batch.min() == 1 and batch.max() == 32
    assert 50 <= np.median(seq) <= 80  # most requests are short...
    assert 0.02 < (seq > 256).mean() < 0.10  # ...with a long tail
    assert seq.mean() > 1.1 * np.median(seq)


def test_trace_round_trip_and_bad_lines(tmp_path: Path):
    path = write_trace(tmp_path / "t.jsonl", generate_trace(5, seed=2))
    assert read_trace(path) == generate_trace(5, seed=2)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"batch": 2, "seq": 9}\n{"batch": 0, "seq": 9}\n')
    with pytest.raises(KilnUserError, match=r"bad.jsonl:2: sizes must be positive"):
        read_trace(bad)
    with pytest.raises(KilnUserError, match="does not exist"):
        read_trace(tmp_path / "missing.jsonl")


def test_serve_bench_cli_replays_every_arm_and_writes_json(tmp_path: Path, capsys):
    trace, out = tmp_path / "trace.jsonl", tmp_path / "result.json"
    workload = f"{Path(__file__).resolve()}:tiny_bert_workload"
    # The eager backend keeps this test about the replay, not about compile time.
    rc = bench.main(
        [
            workload,
            "--trace",
            str(trace),
            "--generate",
            "40",
            "--arms",
            "eager,pow2,learned",
            "--variant",
            "eager",
            "--sample",
            "15",
            "--k",
            "batch=3,seq=4",
            "--max",
            "batch=32,seq=512",
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    result = json.loads(out.read_text())
    arms = {a["arm"]: a for a in result["arms"]}
    assert set(arms) == {"eager", "pow2", "learned"}
    for name in ("pow2", "learned"):
        a = arms[name]
        assert a["status"] == "ok" and a["requests"] == 40
        assert a["recompiles_blocked"] == 0 and a["compilations_replay"] == 0
        assert a["eager_fallbacks"] == 0 and a["padding_waste"] >= 0
        assert a["max_abs_err_vs_fp32"] < 1e-5
        assert a["speedup_vs_eager"]["ci95"][0] <= a["speedup_vs_eager"]["ratio"]
    assert arms["learned"]["bucket_sizes"]["batch"][-1] == 32
    assert len(arms["learned"]["bucket_sizes"]["seq"]) <= 4
    assert arms["pow2"]["bucket_sizes"]["seq"][-1] == 512
    # Latencies split by whether the arm met the request's sizes for the first time.
    sizes = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    distinct = len({(r["batch"], r["seq"]) for r in sizes})
    assert len(sizes) == 40 and 1 < distinct < 40
    for a in arms.values():
        split = a["latency_ms_by_shape"]
        assert split["first_time"]["n"] == distinct
        assert split["first_time"]["n"] + split["seen_before"]["n"] == a["requests"]
        assert a["alloc_retries"] == 0  # counted on CUDA only
    assert result["environment"]["torch"]
    printed = capsys.readouterr().out.strip().splitlines()
    # The legend follows the table; a note on cold first hits may follow it (host-dependent).
    assert any(line.startswith("compiles = during set-up") for line in printed)
    assert any(line.startswith("learned") for line in printed)


def test_serve_bench_rejects_a_trace_without_the_declared_symbols(tmp_path: Path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"tokens": 5}\n')
    workload = f"{Path(__file__).resolve()}:tiny_bert_workload"
    rc = bench.main([workload, "--trace", str(trace), "--device", "cpu", "--arms", "eager"])
    assert rc == 2
