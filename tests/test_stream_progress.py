"""A stream trial's progress file: what a trial stopped at its time limit was doing."""

import json

from torchkiln.runner.protocol import stream_progress

SLEEPY = """
import time
import torch
from torchkiln.workloads.base import Workload


class Sleepy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        time.sleep(0.5)  # every call, eager's and the candidate's
        return self.lin(x)


def make(preset="full", batch_size=None, **_):
    mk = lambda batch, seq: (torch.randn(batch, seq, 4),)
    return Workload(name="sleepy", model=Sleepy().eval(), example_inputs=mk(2, 3),
                    make_inputs=mk, size_limits={"seq": 64})
"""


def _sleepy_spec(tmp_path, rounds):
    """A stream trial's spec: the sleepy model on ``rounds`` x three shapes."""
    (tmp_path / "sleepy.py").write_text(SLEEPY)
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"batch": 2, "seq": {s}}}\n' for s in [3, 5, 7] * rounds))
    return {
        "workload": f"{tmp_path / 'sleepy.py'}:make",
        "step": "infer",
        "preset": "full",
        "batch_size": None,
        "device": "cpu",
        "stream": str(trace),
        "stream_len": None,
    }


def test_the_reason_says_where_the_trial_was():
    d = stream_progress.describe
    assert d(None) == "before it wrote any progress (starting)"
    assert d({"phase": "load", "compiles": 0, "compile_time_s": 0.0}) == (
        "while loading the model and its stream; 0 graphs compiled in 0 s"
    )
    warm = {"phase": "warm-up", "buckets": 4, "buckets_done": 2, "compiles": 2,
            "compile_time_s": 58.4}  # fmt: skip
    assert d(warm) == "while warming up bucket 3 of 4; 2 graphs compiled in 58 s"
    replay = {"phase": "replay", "items": 2000, "items_done": 340, "compiles": 1,
              "compile_time_s": None}  # fmt: skip
    assert d(replay) == "while replaying item 341 of 2000; 1 graph compiled"
    # without dynamo's counters (no compiling backend loaded): where, and nothing more
    assert d({"phase": "replay", "items": 9, "items_done": 0, "compiles": None}) == (
        "while replaying item 1 of 9"
    )
    # every bucket warm, the trial waiting for its turn to replay since 100 s ago, after 50 s
    # of earlier waits: the whole wait is said, as the limit counted it
    waiting = {**warm, "buckets_done": 4, "waiting_since": 1000.0, "waited_s": 50.0}
    assert d(waiting, now=1100.0) == (
        "after warming up its 4 buckets, waiting for its turn on the host (150 s of waits in "
        "all); 2 graphs compiled in 58 s"
    )
    # not waiting now, but it did: the seconds said after where it was
    assert d({**replay, "waited_s": 130.4}) == (
        "while replaying item 341 of 2000 (after 130 s of waits for turns on the host); "
        "1 graph compiled"
    )


def test_progress_is_written_whole_at_each_phase_and_throttled_per_item(tmp_path):
    path = tmp_path / "p.json"
    stream_progress.start(str(path))
    try:
        assert stream_progress.read(path)["phase"] == "load"
        stream_progress.phase("replay", items=3)
        stream_progress.item(1, 3)  # within WRITE_EVERY_S of the phase's write: not written
        doc = stream_progress.read(path)
        assert doc["phase"] == "replay" and doc["items"] == 3 and "items_done" not in doc
        stream_progress.bucket(1, 2)  # a bucket is written at once, with the items so far
        doc = stream_progress.read(path)
        assert (doc["buckets_done"], doc["items_done"]) == (1, 1)
        assert not list(tmp_path.glob("*.tmp"))  # replaced, never left half-written
    finally:
        stream_progress.start(None)
    stream_progress.item(2, 3)  # no file any more: nothing written
    assert stream_progress.read(path)["items_done"] == 1
    assert stream_progress.read(tmp_path / "none.json") is None


def test_a_stream_trial_past_its_limit_says_how_far_it_replayed(tmp_path):
    from torchkiln.cli_stream import run_stream_trial

    spec = {**_sleepy_spec(tmp_path, 10), "variant": "eager"}
    # 30 items, each a second (eager's call and the candidate's): far past the limit
    r = run_stream_trial(spec, 12.0)
    assert r["status"] == "timeout"
    p = r["progress"]
    assert p["phase"] in ("replay", "steady") and p["items"] == 30
    assert 1 <= p["items_done"] < 30
    assert p["compiles"] == 0  # eager: dynamo counted nothing
    assert r["error"] == (
        f"the trial ran past 12 s, while replaying item {p['items_done'] + 1} of 30; "
        "0 graphs compiled in 0 s"
    )
    json.dumps(r)  # what the search keeps in results.json


def test_stream_trials_in_flight_together_replay_steady_items_one_at_a_time(tmp_path):
    """Two trials on one lock file (a search with two slots): their loads, warm-ups and first
    items may overlap, each replay's steady items run with nothing else on the host (from the
    wall-clock intervals each trial records), and the wait for it is the trial's own record,
    not its time."""
    from concurrent.futures import ThreadPoolExecutor

    from torchkiln.cli_stream import run_stream_trial
    from torchkiln.runner.launch.executors import host_lock_file
    from torchkiln.runner.launch.host_lock import remove_lock_files, set_compile_slots

    spec = _sleepy_spec(tmp_path, 2)
    lock = host_lock_file()
    set_compile_slots(lock, 2)
    variants = ["eager+bucket=pow2", "eager"]
    try:
        with ThreadPoolExecutor(2) as pool:
            futs = [
                pool.submit(
                    run_stream_trial, {**spec, "variant": v}, 300.0, own_cap_s=200.0, host_lock=lock
                )  # fmt: skip
                for v in variants
            ]
            a, b = (f.result() for f in futs)
    finally:
        remove_lock_files(lock)
    assert a["status"] == b["status"] == "ok", (a.get("error"), b.get("error"))
    assert set(a["phase_at"]) == {"load", "warm-up", "replay", "steady"}
    assert set(b["phase_at"]) == {"load", "replay", "steady"}

    def overlap(x, y):
        return x[0] < y[1] and y[0] < x[1]

    for mine, other in ((a, b), (b, a)):
        # the first 20% of items (one of six here) began after the load, the rest after them
        at = mine["phase_at"]
        assert at["load"][1] <= at["replay"][0] <= at["replay"][1] <= at["steady"][0]
        for name, span in other["phase_at"].items():
            assert not overlap(at["steady"], span), (name, mine, other)
    # both were in flight at once: one waited for the other's replay (6 items of 1 s, loads
    # of about the same length before them), and its own seconds, the wait not counted, stayed
    # under its cap
    assert max(a["host_wait_s"], b["host_wait_s"]) > 2.0
