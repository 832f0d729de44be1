"""benchmarks/bench_stream.py's summary as pure functions over made-up parts (no trial runs):
which plain modes a stream pick faces, and the goals judged from the files the parts leave."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location(
        "bench_stream", ROOT / "benchmarks" / "bench_stream.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")


def test_a_bf16_pick_faces_the_four_plain_modes_at_bf16_after_itself():
    b = _script()
    pick = "inductor:mode=reduce-overhead,dynamic=false+bf16+bucket=learned"
    assert b.replayed_variants(pick, MODES, ("bf16",)) == [
        pick,
        "inductor+bf16",
        "inductor:mode=reduce-overhead+bf16",
        "inductor:mode=max-autotune-no-cudagraphs+bf16",
        "inductor:mode=max-autotune+bf16",
    ]
    # max-autotune's replays last, the rest in that order
    assert b.start_order(b.replayed_variants(pick, MODES, ("bf16",))) == [
        pick,
        "inductor+bf16",
        "inductor:mode=reduce-overhead+bf16",
        "inductor:mode=max-autotune-no-cudagraphs+bf16",
        "inductor:mode=max-autotune+bf16",
    ]


def test_max_autotune_replays_start_once_no_other_replay_is_in_flight(
    tmp_path, monkeypatch, capsys
):
    import threading
    import time

    import torchkiln.cli_stream

    b = _script()
    pick = "inductor:dynamic=false+bf16+bucket=pow2"
    _parts(tmp_path, b, pick, {})
    results = b.tune_dir(tmp_path, "bert-base", "infer") / "results.json"
    doc = json.loads(results.read_text())
    doc["stream"] |= {"workload": "simple", "step": "infer", "preset": "tiny",
                      "batch_size": None, "device": "cpu", "stream": None}  # fmt: skip
    results.write_text(json.dumps(doc))
    spans: dict[str, list[float]] = {}
    lock = threading.Lock()

    def fake_trial(spec, timeout_s, *, own_cap_s=None, host_lock=None):
        with lock:
            spans[spec["variant"]] = [time.monotonic()]
        time.sleep(0.3 if "max-autotune" not in spec["variant"] else 0.05)
        with lock:
            spans[spec["variant"]].append(time.monotonic())
        return {"status": "ok", "items": 10, "total_s": 1.0, "steady_time_per_item_s": 0.1}

    monkeypatch.setattr(torchkiln.cli_stream, "run_stream_trial", fake_trial)
    monkeypatch.setattr(b, "environment", lambda device: {"made": "up"})
    monkeypatch.setenv("KILN_COMPILE_WORKERS", "4")  # four slots: all could start at once
    args = argparse.Namespace(plain_modes=",".join(MODES), allow_precision="bf16", stream_len=10,
                              part_budget="10m", min_trial=1.0, trial_timeout=60.0,
                              device="cpu")  # fmt: skip
    b.run_plain(args, "bert-base", "infer", tmp_path, "python bench_stream.py", time.monotonic())
    assert len(spans) == 5
    others_end = max(end for v, (_, end) in spans.items() if "max-autotune" not in v)
    autotuned = [start for v, (start, _) in spans.items() if "max-autotune" in v]
    assert len(autotuned) == 2 and min(autotuned) >= others_end
    # each written as it finished
    written = sorted(f.name for f in b.plain_dir(tmp_path, "bert-base", "infer").iterdir())
    assert len(written) == 5
    # a rerun replays only what is missing; with --again-pick the pick beside it
    b.trial_file(b.plain_dir(tmp_path, "bert-base", "infer"), "inductor+bf16").unlink()
    spans.clear()
    b.run_plain(args, "bert-base", "infer", tmp_path, "python bench_stream.py", time.monotonic())
    assert list(spans) == ["inductor+bf16"]
    b.trial_file(b.plain_dir(tmp_path, "bert-base", "infer"), "inductor+bf16").unlink()
    spans.clear()
    args.again_pick = True
    b.run_plain(args, "bert-base", "infer", tmp_path, "python bench_stream.py", time.monotonic())
    assert sorted(spans) == sorted([pick, "inductor+bf16"])
    # with nothing missing, the pick is not replayed again, and the rerun says how to
    spans.clear()
    capsys.readouterr()
    b.run_plain(args, "bert-base", "infer", tmp_path, "python bench_stream.py", time.monotonic())
    assert spans == {}
    assert "to replay one again, remove its file there" in capsys.readouterr().out


def test_an_fp32_or_eager_pick_also_faces_the_plain_modes_at_bf16():
    b = _script()
    for pick in ("inductor:dynamic=true", "eager"):
        got = b.replayed_variants(pick, ("default",), ("bf16",))
        assert got == [pick, "inductor", "inductor+bf16"]
    # a pick that is a plain mode is replayed once, and is its own competitor
    assert b.replayed_variants("inductor+bf16", ("default",), ("bf16",)) == ["inductor+bf16"]


def _trial(total, steady, speedup, *, compiles=0, invocation="call 1", status="ok"):
    return {
        "status": status,
        "items": 100,
        "total_s": total,
        "steady_time_per_item_s": steady,
        "speedup": speedup,
        "steady_compiles": compiles,
        "invocation": invocation,
        "command": f"python bench_stream.py --only plain ({invocation})",
    }


def _parts(tmp_path: Path, b, pick: str, trials: dict, wall_s: float = 300.0) -> None:
    d = b.tune_dir(tmp_path, "bert-base", "infer")
    d.mkdir(parents=True)
    doc = {
        "selection": {"best": pick, "reason": "fastest"},
        "wall_s": wall_s,
        "budget_s": 510.0,
        "environment": {"gpu": "made up"},
        "stream": {"items": 100},
        "stages": {"search": {"planned": [pick], "skipped": {}}},
    }
    (d / "results.json").write_text(json.dumps(doc))
    (d / "bench_part.json").write_text(
        json.dumps({"command": "python bench_stream.py --only tune"})
    )
    p = b.plain_dir(tmp_path, "bert-base", "infer")
    p.mkdir()
    for v, t in trials.items():
        (b.trial_file(p, v)).write_text(json.dumps(t))


def _summary(tmp_path, b, modes=MODES):
    args = argparse.Namespace(plain_modes=",".join(modes), allow_precision="bf16")
    b.summarize(args, tmp_path, ["bert-base:infer"], "python bench_stream.py --summarize")
    return json.loads((tmp_path / "bench_stream.json").read_text())


def test_the_goals_are_judged_against_the_fastest_plain_mode(tmp_path):
    b = _script()
    pick = "inductor:dynamic=false+bf16+bucket=pow2"
    trials = {
        pick: _trial(13.0, 0.004, 6.0),
        "inductor+bf16": _trial(30.0, 0.012, 2.0),
        # the fastest plain mode over the whole stream, and a different one after warm-up
        "inductor:mode=reduce-overhead+bf16": _trial(25.0, 0.010, 2.4),
        "inductor:mode=max-autotune-no-cudagraphs+bf16": _trial(40.0, 0.008, 1.5),
        "inductor:mode=max-autotune+bf16": _trial(0, 0, 0, status="timeout") | {"total_s": None},
    }
    _parts(tmp_path, b, pick, trials)
    row = _summary(tmp_path, b)["rows"][0]
    assert row["best_plain_total"] == "inductor:mode=reduce-overhead+bf16"
    assert row["over_best_plain_total"] == pytest.approx(25.0 / 13.0)  # under 2x...
    assert row["best_plain_steady"] == "inductor:mode=max-autotune-no-cudagraphs+bf16"
    assert row["over_best_plain_steady"] == 2.0  # ...and 2x after warm-up: judged so
    assert row["over_best_plain_total_via_eager"] == 2.5
    assert row["pick_and_best_plain_one_call"] is True
    assert list(row["plain_not_measured"]) == ["inductor:mode=max-autotune+bf16"]
    g = row["goals"]
    assert g["over_best_plain_2.0x"] is True
    assert g["all_plain_modes_measured"] is False
    assert g["no_recompile_after_warmup"] is True
    assert g["tune_within_15m"] is True


def test_a_plain_mode_stopped_at_its_cap_is_bounded_by_its_compiles(tmp_path):
    b = _script()
    pick = "inductor:mode=reduce-overhead,dynamic=false+bf16+bucket=learned"
    progress = {"phase": "replay", "items": 2000, "items_done": 212, "compiles": 3,
                "compile_time_s": 234.0}  # fmt: skip
    stopped = _trial(0, 0, 0, status="timeout") | {"total_s": None, "progress": progress}
    trials = {
        pick: _trial(104.0, 0.0085, 3.3),
        "inductor+bf16": _trial(300.0, 0.06, 0.5),
        "inductor:mode=max-autotune+bf16": stopped,
    }
    _parts(tmp_path, b, pick, trials)
    modes = ("default", "max-autotune")
    row = _summary(tmp_path, b, modes=modes)["rows"][0]
    bound = row["plain_stopped"]["inductor:mode=max-autotune+bf16"]
    assert bound["total_s_at_least"] == 234.0
    assert bound["items_done"] == 212
    assert bound["over_pick_total_at_least"] == pytest.approx(234.0 / 104.0)
    g = row["goals"]
    assert g["all_plain_modes_measured"] is False  # a bound is not a measurement
    assert g["stopped_plain_modes_slower_over_the_stream"] is True  # 2.25x >= 2.0x
    # a stop too early to clear the goal says so
    progress["compile_time_s"] = 150.0
    (b.trial_file(b.plain_dir(tmp_path, "bert-base", "infer"),
                  "inductor:mode=max-autotune+bf16")).write_text(json.dumps(stopped))  # fmt: skip
    g = _summary(tmp_path, b, modes=modes)["rows"][0]["goals"]
    assert g["stopped_plain_modes_slower_over_the_stream"] is False
    # a plain mode with no result at all: no bound, and no verdict on the stopped ones
    trials_file = b.trial_file(b.plain_dir(tmp_path, "bert-base", "infer"), "inductor+bf16")
    trials_file.unlink()
    g = _summary(tmp_path, b, modes=modes)["rows"][0]["goals"]
    assert "stopped_plain_modes_slower_over_the_stream" not in g


def test_a_pick_that_recompiles_after_warm_up_or_is_missing_is_judged_so(tmp_path):
    b = _script()
    pick = "inductor:dynamic=true+bf16"
    trials = {
        pick: _trial(20.0, 0.008, 3.0, compiles=2, invocation="call 2"),
        "inductor+bf16": _trial(30.0, 0.012, 2.0),
    }
    _parts(tmp_path, b, pick, trials, wall_s=1000.0)
    row = _summary(tmp_path, b, modes=("default",))["rows"][0]
    assert row["over_best_plain_total"] == 1.5
    assert row["pick_and_best_plain_one_call"] is False
    g = row["goals"]
    assert g["over_best_plain_2.0x"] is False
    assert g["recompiles_after_warmup"] == 2
    assert g["no_recompile_after_warmup"] is False
    assert g["tune_within_15m"] is False
    # without the pick's replay nothing is compared, and the row says what is missing
    b.trial_file(b.plain_dir(tmp_path, "bert-base", "infer"), pick).unlink()
    row = _summary(tmp_path, b, modes=("default",))["rows"][0]
    assert row["missing"].startswith("the pick's replay: no result")
    assert row["goals"]["over_best_plain_2.0x"] is None
