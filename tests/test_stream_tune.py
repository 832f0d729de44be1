"""`kiln tune --stream`: the shape candidates, a bucketed trial's compiles, the pick on a stream
and the code it ships, and bad traces."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests_helpers import assert_stream_pick
from torchkiln.errors import KilnUserError
from torchkiln.tune.recommend import stream_code
from torchkiln.tune.stream_plan import parse_stream_candidate, stream_candidates

# A per-position model: padding the sequence and cutting the output back is exact, so a bucketed
# candidate must match eager item by item.
FACTORY = """
import torch
from torchkiln.workloads.base import Workload


class PerToken(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2


def make(preset="full", batch_size=None, **_):
    torch.manual_seed(0)
    mk = lambda batch, seq: (torch.randn(batch, seq, 8),)
    return Workload(name="pertoken", model=PerToken().eval(), example_inputs=mk(2, 8),
                    make_inputs=mk, size_limits={"seq": 64})
"""


def _kiln(*argv: str):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    return subprocess.run(
        [sys.executable, "-m", "torchkiln.cli", *argv], capture_output=True, text=True, env=env
    )


@pytest.fixture
def tiny(tmp_path):
    (tmp_path / "pertoken.py").write_text(FACTORY)
    trace = tmp_path / "t.jsonl"
    # three shapes, each seen three times
    trace.write_text("".join(f'{{"batch": 2, "seq": {s}}}\n' for s in [5, 9, 16] * 3))
    return f"{tmp_path / 'pertoken.py'}:make", trace


def test_the_plan_holds_every_shape_candidate():
    cpu = [c.name for c in stream_candidates("cpu", set())]
    assert cpu == [
        "inductor:dynamic=false+bucket=learned",
        "inductor:dynamic=false+bucket=pow2",
        "inductor+mark_dynamic",
        "inductor:dynamic=true",
        "inductor",
        "inductor:dynamic=false+recompile_limit=64",
    ]
    gpu = [c.name for c in stream_candidates("cuda", {"bf16"}, can_bucket=False)]
    assert "inductor:mode=reduce-overhead,dynamic=true+bf16" in gpu
    assert "inductor:mode=reduce-overhead+bf16" in gpu
    assert "inductor:mode=reduce-overhead+bf16+mark_dynamic" in gpu
    assert "inductor+bf16+mark_dynamic" in gpu
    assert not any("bucket" in n for n in gpu)
    assert len(gpu) == 2 * 2 * 4  # fp32 and bf16, two modes, four ways
    # On a GPU: the allowed precision first, each way under both modes before the next way.
    full = [c.name for c in stream_candidates("cuda", {"bf16"})]
    assert full[:4] == [
        "inductor:dynamic=false+bf16+bucket=learned",
        "inductor:mode=reduce-overhead,dynamic=false+bf16+bucket=learned",
        "inductor:dynamic=false+bf16+bucket=pow2",
        "inductor:mode=reduce-overhead,dynamic=false+bf16+bucket=pow2",
    ]
    assert full[11] == "inductor:mode=reduce-overhead,dynamic=false+bf16+recompile_limit=64"
    assert full[12] == "inductor:dynamic=false+bucket=learned" and len(full) == 24
    unsized = stream_candidates("cpu", set(), can_bucket=False, can_mark=False)
    assert not any("mark_dynamic" in c.name or "bucket" in c.name for c in unsized)
    for n in cpu + gpu:
        assert parse_stream_candidate(n).name == n
    with pytest.raises(KilnUserError, match="bucket must be one of"):
        parse_stream_candidate("inductor+bucket=cubes")
    assert parse_stream_candidate("inductor+mark_dynamic+bf16").mark_dynamic
    for bad, needle in [
        ("inductor:dynamic=false+mark_dynamic", "dynamic left unset"),
        ("eager+mark_dynamic", "dynamic left unset"),
        ("inductor+mark_dynamic+bucket=pow2", "exclude each other"),
        ("inductor+mark_dynamic=1", "takes no value"),
    ]:
        with pytest.raises(KilnUserError, match=needle):
            parse_stream_candidate(bad)


def test_mark_dynamic_compiles_one_graph_over_three_shapes_and_matches_eager(tiny):
    from torchkiln.cli_stream import run_stream_trial

    factory, trace = tiny
    spec = {"workload": factory, "preset": "tiny", "device": "cpu", "stream": str(trace)}
    marked = run_stream_trial({**spec, "variant": "inductor+mark_dynamic"}, 300)
    auto = run_stream_trial({**spec, "variant": "inductor"}, 300)
    for r in (marked, auto):
        assert r["status"] == "ok", r
        assert r["mismatched_items"] == [] and r["distinct_shapes"] == 3
        assert r["padding_waste"] == 0.0  # nothing padded
    assert marked["mark_dynamic"] is True and auto["mark_dynamic"] is False
    if marked["compiles"] is not None:
        # dynamo's counters: one dynamic graph from the first call; automatic dynamic compiles
        # a static graph first and recompiles at the first change of seq
        assert marked["compiles"] == 1 and marked["recompiles"] == 0
        assert auto["compiles"] == 2
    assert marked["eager_fallbacks"] == 0


def test_bucketed_trial_compiles_once_per_bucket_and_not_after_warmup(tiny):
    from torchkiln.cli_stream import run_stream_trial

    factory, trace = tiny
    spec = {"workload": factory, "preset": "tiny", "device": "cpu", "stream": str(trace)}
    r = run_stream_trial({**spec, "variant": "inductor:dynamic=false+bucket=pow2"}, 300)
    assert r["status"] == "ok", r
    assert r["buckets"] == {"seq": [8, 16]}  # powers of two from the smallest size, 5
    assert r["warmup_compiles"] in (2, None)  # None: this torch has no counter
    assert r["compiles"] in (0, None)
    assert r["eager_fallbacks"] == 0 and r["mismatched_items"] == []
    assert r["varying_dims"] == [[0, 1, "seq"]]
    assert r["compile_cache"] == "fresh per trial"


def test_a_stream_trial_compiles_into_empty_caches_of_its_own(monkeypatch):
    from torchkiln import cli_stream
    from torchkiln.diagnose import _subproc

    seen = []

    def fake_run_module(module, args, *, env=None, **_):
        seen.append({k: (v, os.listdir(v) if os.path.isdir(v) else None) for k, v in env.items()})
        Path(args[1]).write_text(json.dumps({"status": "ok"}))
        return _subproc.ProcResult(0, "", "", False, 0.0)

    monkeypatch.setattr(_subproc, "run_module", fake_run_module)
    for _ in range(2):
        r = cli_stream.run_stream_trial({"variant": "inductor"}, 10)
        assert r["compile_cache"] == "fresh per trial"
    first, second = seen
    for key in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        assert first[key][0] != second[key][0]  # never the same directory twice
        assert first[key][1] in (None, [])  # empty when the replay starts
        assert not os.path.exists(first[key][0])  # gone with the trial


def test_tune_on_a_stream_picks_the_fastest_correct_candidate(tiny, tmp_path):
    from torchkiln.report.schema import validate

    factory, trace = tiny
    out = tmp_path / "tune"
    p = _kiln("tune", factory, "--device", "cpu", "--stream", str(trace), "--budget", "90s",
              "--out", str(out))  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads((out / "results.json").read_text())
    validate(doc)
    assert doc["stream"]["items"] == 9
    trials = {t["variant"]: t for t in doc["trials"]}
    ok = {v: t["stream"] for v, t in trials.items() if t["status"] == "ok"}
    assert ok, doc["trials"]
    sel = doc["selection"]
    for v, s in ok.items():
        assert sel["total_s"][v] == s["total_s"]
        assert sel["steady_s_per_item"][v] == s["steady_time_per_item_s"]
        assert trials[v]["stream"]["mismatched_items"] == []
    assert_stream_pick(sel, ok)
    static = trials.get("inductor:dynamic=false+recompile_limit=64")
    # Planned last, the raised limit may be stopped or skipped by the budget on a busy host
    # (test_stream.py counts a static replay's compiles on its own).
    if static and static["status"] == "ok" and static["stream"]["compiles"] is not None:
        # one graph per distinct shape, from dynamo's own counters
        assert static["stream"]["compiles"] == static["stream"]["distinct_shapes"] == 3
    assert doc["recommendation"]["variant"] == sel["best"]
    assert f"pick: {sel['best']}" in p.stdout


def _tune_on_trace(stream_search, factory, trace, budget_s):
    """A stream tune of the tiny model on ``trace`` on the CPU, with the trial runner as the
    caller patched it."""
    return stream_search.tune_stream(
        factory, device="cpu", preset="tiny", batch_size=None, budget_s=budget_s,
        allow_precision=set(), out=Path(trace).parent / "out", stream=str(trace),
        stream_len=None,
    )  # fmt: skip


@pytest.mark.parametrize(
    "line, needle",
    [
        ('{"batch": 2, "seq": -3}', "t.jsonl:2: sizes must be positive"),
        ('{"batch": 2}', "t.jsonl:2"),
    ],
)
def test_bad_stream_for_tune_is_one_line_exit_2(tiny, tmp_path, line, needle):
    factory, trace = tiny
    trace.write_text('{"batch": 2, "seq": 5}\n' + line + "\n")
    out = tmp_path / "tune"
    p = _kiln("tune", factory, "--device", "cpu", "--stream", str(trace), "--out", str(out))
    assert p.returncode == 2
    assert needle in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (out / "results.json").exists()


def test_missing_stream_file_for_tune(tmp_path):
    p = _kiln("tune", "simple", "--device", "cpu", "--stream", str(tmp_path / "none.jsonl"))
    assert p.returncode == 2 and "no such file" in p.stderr


def test_code_for_a_bucketed_and_a_dynamic_pick():
    metrics = {"varying_dims": [[0, 1, "seq"]], "buckets": {"seq": [8, 16]}}
    code = stream_code("inductor:dynamic=false+bucket=learned", metrics, "cpu")
    assert "BucketedModule(" in code
    assert "buckets={'seq': (8, 16)}" in code and "dynamic_dims={0: {1: 'seq'}}" in code
    assert "served.warmup(" in code and "recompiles_after_warmup" in code
    code = stream_code("inductor:dynamic=true", metrics, "cpu")
    assert "torch.compile(model, dynamic=True)" in code
    code = stream_code("inductor", metrics, "cpu")
    assert "torch._dynamo.mark_dynamic(args[0], 1)  # seq" in code
    code = stream_code("inductor:dynamic=false+recompile_limit=64", metrics, "cpu")
    assert "setattr(torch._dynamo.config, limit, 64)" in code
    code = stream_code("inductor+bf16+mark_dynamic", metrics, "cuda")
    assert "torch._dynamo.mark_dynamic(args[0], 1)  # seq" in code
    assert "optional" not in code and "run = torch.compile(model)" in code
    kw = {"varying_dims": [["input_ids", 1, "seq"]]}
    code = stream_code("inductor+mark_dynamic", kw, "cpu")
    assert 'torch._dynamo.mark_dynamic(kwargs["input_ids"], 1)  # seq' in code


def test_explain_on_a_stream_names_the_guard_dim_count_and_limit(tiny, tmp_path):
    factory, trace = tiny
    out = tmp_path / "ex.json"
    p = _kiln("explain", factory, "--device", "cpu", "--stream", str(trace), "--variant",
              "inductor:dynamic=false", "--recompile-limit", "2", "--json", str(out))  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    rec = json.loads(out.read_text())["recompiles"]
    assert rec["source"].startswith("the stream")
    assert rec["recompilations"][0]["trigger"].endswith("t.jsonl:2")  # seq 5 -> 9
    (g,) = rec["by_guard"]
    assert (g["input"], g["dim"]) == ("x", 1)
    # seq 9 recompiled; seq 16 found the limit of 2 graphs reached and ran in eager
    assert g["count"] == 2 and g["fell_back_to_eager"] == 1
    assert rec["limit_hit"] is True
    assert "x dim 1 changed 2x" in p.stdout
    cost = rec["stream_cost"]  # dynamo's tracing over the replay's seconds, and its verdicts
    assert 0 <= cost["compile_share"] <= 1 and cost["total_s"] > 0
    if cost["compile_share"] > 0.5:
        assert cost["verdicts"][0].startswith("compilation dominates this stream")
    else:
        assert cost["verdicts"] == []
    assert "of the replay" in p.stdout


def test_explain_on_a_bad_stream_is_one_line_exit_2(tiny):
    factory, trace = tiny
    trace.write_text('{"batch": 2, "seq": 5}\n{"batch": 2, "seq": 0}\n')
    p = _kiln("explain", factory, "--device", "cpu", "--stream", str(trace))
    assert p.returncode == 2 and "t.jsonl:2" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def _stream_trial(variant, total, eager_total, steady, eager_steady, status="ok", items=100):
    return {
        "variant": variant,
        "status": status,
        "reason": "" if status == "ok" else "items [1] differ from eager",
        "stream": {"total_s": total, "eager_total_s": eager_total, "items": items,
                   "steady_time_per_item_s": steady, "eager_steady_time_per_item_s": eager_steady,
                   "compiles": 2, "distinct_shapes": 3, "recompiles": 1, "eager_fallbacks": 0,
                   "steady_speedup": eager_steady / steady},
    }  # fmt: skip


def test_selection_on_a_stream_is_the_fastest_correct_after_warm_up():
    from torchkiln.tune.stream_search import _select, _why

    trials = [
        # one graph: the shortest whole stream, 20 ms an item after warm-up
        _stream_trial("inductor:dynamic=true", 2.5, 4.0, 0.020, 0.040),
        # a 2 s warm-up of its buckets, then 10 ms an item: the pick
        _stream_trial("inductor:dynamic=false+bucket=pow2", 3.0, 4.2, 0.010, 0.042),
        _stream_trial("inductor", 0.5, 4.0, 0.001, 0.040, status="incorrect"),  # fast, wrong
    ]
    sel = _select(trials)
    assert sel["best"] == "inductor:dynamic=false+bucket=pow2"
    assert sel["ranking"] == [sel["best"], "inductor:dynamic=true", "eager"]
    assert sel["steady_s_per_item"]["eager"] == pytest.approx(0.041)  # median of eager's replays
    assert sel["total_s"] == {"inductor:dynamic=true": 2.5,
                              "inductor:dynamic=false+bucket=pow2": 3.0, "eager": 4.1}  # fmt: skip
    # the one-off seconds over the steady rate, repaid by the gain over eager on each item:
    # (3.0 - 100 x 0.010) / (0.041 - 0.010) = 64.5, and (2.5 - 2.0) / 0.021 = 23.8
    assert sel["break_even_steps"] == {"inductor:dynamic=true": 24,
                                       "inductor:dynamic=false+bucket=pow2": 65}  # fmt: skip
    assert sel["reason"] == (
        "the fastest correct candidate after warm-up: 10.000 ms an item against eager's 41.000 ms "
        "(4.10x); over the whole stream, compiles and warm-up included, 3.000 s against eager's "
        "4.100 s, repaid after 65 items"
    )
    assert "inductor" in sel["rejected"]
    assert "3 shapes" in _why(trials[1], sel)[1]
    slow = _select([_stream_trial("inductor", 5.0, 4.0, 0.05, 0.04)])
    assert slow["best"] == "eager" and "no candidate was faster" in slow["reason"]
    assert slow["break_even_steps"] == {"inductor": None}  # slower: never repaid


def test_a_search_without_a_result_says_how_its_trials_ended():
    from torchkiln.tune.stream_search import _select

    def ended(variant, status):
        return {"variant": variant, "status": status, "reason": "", "stream": {}}

    sel = _select([ended("a", "timeout"), ended("b", "timeout"), ended("c", "incorrect")])
    assert sel["best"] is None and sel["rejected"].keys() == {"a", "b", "c"}
    assert sel["reason"] == (
        "no candidate replayed the stream correctly: of 3, 2 ran past their caps, "
        "1 did not match eager (a larger --budget, or a shorter --stream-len, gives each trial "
        "more room)"
    )
    assert _select([ended("a", "crashed")])["reason"].endswith("of 1, 1 crashed")
    assert _select([])["reason"] == "no candidate was measured on the stream"


def test_the_api_takes_a_stream_with_a_workload_spec_only(tmp_path):
    import torch

    import torchkiln

    with pytest.raises(KilnUserError, match="a stream tune takes a workload spec"):
        torchkiln.tune(torch.nn.Linear(2, 2), (torch.randn(1, 2),), device="cpu",
                       stream_len=5, out=tmp_path / "t")  # fmt: skip


EMBED_FACTORY = """
import torch
from torchkiln.workloads.base import Workload


class Tokens(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(32, 8)
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, ids):
        return self.lin(self.emb(ids))


def make(preset="full", batch_size=None, **_):
    torch.manual_seed(0)
    mk = lambda batch, seq: (torch.randint(0, 32, (batch, seq)),)
    return Workload(name="tokens", model=Tokens().eval(), example_inputs=mk(2, 8),
                    make_inputs=mk, size_limits={"seq": 64})
"""


@pytest.mark.gpu
def test_a_bucketed_trial_warms_up_on_the_models_device(tmp_path):
    # the warm-up's example request (token ids, made on the CPU as every stream item is) is
    # moved to the model's device like the replay's items: an embedding lookup with CPU ids
    # into CUDA weights fails on the first bucket
    from torchkiln.cli_stream import run_stream_trial

    (tmp_path / "tokens.py").write_text(EMBED_FACTORY)
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"batch": 2, "seq": {s}}}\n' for s in [5, 9, 16] * 3))
    spec = {"workload": f"{tmp_path / 'tokens.py'}:make", "preset": "tiny", "device": "cuda"}
    r = run_stream_trial(
        {**spec, "stream": str(trace), "variant": "inductor:dynamic=false+bucket=pow2"}, 300
    )
    assert r["status"] == "ok", r
    assert r["buckets"] == {"seq": [8, 16]}
    assert r["mismatched_items"] == []


def test_a_stream_trial_past_its_timeout_is_a_timeout(tiny):
    # the replay runs in its own session, ended with its process group at the timeout (here
    # while it is still importing torch): a status with its reason, not a crash
    from torchkiln.cli_stream import run_stream_trial

    factory, trace = tiny
    spec = {"workload": factory, "preset": "tiny", "device": "cpu", "stream": str(trace)}
    r = run_stream_trial({**spec, "variant": "eager"}, 0.2)
    assert r == {
        "variant": "eager",
        "status": "timeout",
        "error": "the trial ran past 0 s, before it wrote any progress (starting)",
        "progress": None,
    }


def test_the_stream_search_starts_a_candidate_only_when_its_estimate_fits(tiny, monkeypatch):
    """Each trial's seconds: 10 besides its compiles, 20 a compile. The first trial is the one
    expected to compile least and may take half the budget; from it the search learns both, caps
    each trial at 3x its estimate (at least 60 s) and skips what would not fit."""
    from torchkiln import cli_stream
    from torchkiln.tune import stream_search

    factory, trace = tiny
    clock = [0.0]
    caps = []

    class Clock:
        @staticmethod
        def monotonic():
            return clock[0]

    def fake(spec, timeout_s, *, own_cap_s=None, host_lock=None):
        assert host_lock is None and timeout_s == 200.0 - clock[0]  # one at a time on the CPU
        caps.append((spec["variant"], own_cap_s))
        n = compiles[spec["variant"]]
        wall = 10.0 + 20.0 * n
        clock[0] += wall
        spent = {"warmup_s": 20.0 * n} if "bucket" in spec["variant"] else {
            "compile_time_s": 20.0 * n}  # fmt: skip
        return {"variant": spec["variant"], "status": "incorrect", "mismatched_items": [0],
                "process_wall_s": wall, **spent}  # fmt: skip

    # three shapes (5, 9, 16): learned buckets 5 and 16, powers of two 8 and 16
    compiles = {
        "inductor+mark_dynamic": 1,
        "inductor:dynamic=false+bucket=learned": 2,
        "inductor:dynamic=false+bucket=pow2": 2,
        "inductor:dynamic=true": 1,
        "inductor": 2,  # a static graph, then a dynamic one
        "inductor:dynamic=false+recompile_limit=64": 3,  # one per shape
    }
    monkeypatch.setattr(cli_stream, "run_stream_trial", fake)
    monkeypatch.setattr(stream_search, "time", Clock)
    doc = _tune_on_trace(stream_search, factory, trace, 200)
    search = doc["stages"]["search"]
    assert search["expected_compiles"] == compiles
    assert caps == [
        ("inductor+mark_dynamic", 100.0),  # the least compiling first: half of 200 s
        ("inductor:dynamic=false+bucket=learned", 150.0),  # 3 x (10 + 2 x 20)
        ("inductor:dynamic=false+bucket=pow2", 120.0),  # all that is left, under 150
        ("inductor:dynamic=true", 70.0),  # 3 x 30 = 90, but 70 s left
    ]
    assert search["skipped"] == {
        "inductor": "would not fit the budget (estimated 50 s for 2 compiles, 40 s left)",
        "inductor:dynamic=false+recompile_limit=64": (
            "would not fit the budget (estimated 70 s for 3 compiles, 40 s left)"
        ),
    }
    assert search["estimate"]["fixed_s"] == 10.0 and search["estimate"]["per_compile_s"] == 20.0
    assert [t["stream"]["estimate_s"] for t in doc["trials"]] == [None, 50.0, 50.0, 30.0]


def test_with_two_slots_two_trials_run_at_once_from_the_start(tiny, monkeypatch):
    """Before any trial has ended there is no estimate: each free slot starts the next
    candidate with half of what is left, the first beside the second, not alone."""
    import threading
    import time

    from torchkiln import cli_stream
    from torchkiln.tune import stream_search

    factory, trace = tiny
    spans, locks, caps = {}, set(), {}
    gate = threading.Lock()

    def fake(spec, timeout_s, *, own_cap_s=None, host_lock=None):
        t0 = time.monotonic()
        time.sleep(0.3)
        with gate:
            spans[spec["variant"]] = (t0, time.monotonic())
            locks.add(host_lock)
            caps[spec["variant"]] = (own_cap_s, timeout_s)
        return {"variant": spec["variant"], "status": "incorrect", "mismatched_items": [0],
                "process_wall_s": 0.3, "host_wait_s": 0.0, "compile_time_s": 0.1}  # fmt: skip

    monkeypatch.setenv("KILN_COMPILE_WORKERS", "2")
    monkeypatch.setattr(cli_stream, "run_stream_trial", fake)
    doc = _tune_on_trace(stream_search, factory, trace, 600)
    search = doc["stages"]["search"]
    assert search["in_flight"] == {"trials": 2, "why": "2 at once (asked for)"}
    assert len(spans) == len(search["order"]) == 6 and not search["skipped"]
    assert len(locks) == 1 and None not in locks  # one pool lock file, passed to every trial
    first, second = (spans[v] for v in search["order"][:2])
    assert second[0] < first[1]  # the second started while the first ran
    for v in search["order"][:2]:  # no estimate yet: half of what was left at its start
        cap, room = caps[v]
        assert cap == pytest.approx(0.5 * room)
    later = caps[search["order"][2]]
    assert later[0] == 60.0  # then 3x its estimate (well under a second), at least 60 s
    assert [t["variant"] for t in doc["trials"]] == search["order"]  # in the order started
