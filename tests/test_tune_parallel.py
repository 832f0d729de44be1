"""With several GPUs visible, kiln tune runs independent candidates at once, one per GPU.

The GPUs are simulated: the pipeline is told two are visible and its trial runner is replaced by
one that records which GPU each trial was pinned to and when it ran (the real runner sets
CUDA_VISIBLE_DEVICES from that argument: tests/test_executors.py).
"""

from __future__ import annotations

import threading
import time

from tests_helpers import _trial, fake_tune_trials
from torchkiln.tune import pipeline


def test_independent_candidates_run_at_once_one_per_gpu(tmp_path, monkeypatch):
    calls: list[dict] = []
    lock = threading.Lock()

    def fake_run_trial(
        spec,
        trial_dir,
        *,
        timeout_s,
        wall_s=None,
        gpu=None,
        host_lock=None,
        on_phase=None,
        cache_dir=None,
        keep_cache=False,
        lend_caches=None,
    ):
        start = time.monotonic()
        time.sleep(0.3)  # long enough for a batch's trials to overlap
        with lock:
            calls.append(
                {"variant": spec.variant, "index": spec.index, "gpu": gpu,
                 "host_lock": host_lock, "timeout_s": timeout_s, "wall_s": wall_s,
                 "baseline": spec.baseline, "start": start, "end": time.monotonic(),
                 "id": spec.id, "keep_cache": keep_cache, "lend_caches": lend_caches}
            )  # fmt: skip
        # Earlier candidates lead (2.0x, 1.99x, ...); head-to-head challengers lose.
        speedup = 1.0 if spec.variant == "eager" else 2.0 - 0.01 * (spec.index % 50)
        if spec.baseline != "eager":
            speedup = 0.9
        # Index 3 has the shortest step but not the best speedup (its own eager read faster),
        # so the finalists are two challengers: the runner-up by speedup and the fastest.
        ms = 4.0 if spec.index == 3 and spec.baseline == "eager" else 10.0 / speedup
        result = _trial(spec.variant, ms, speedup, 0.0 if spec.index == 0 else 5.0)
        result.update(id=spec.id, baseline=spec.baseline, process_wall_s=1.0)
        return result

    fake_tune_trials(monkeypatch, fake_run_trial, gpus=(0, 1))

    doc = pipeline.tune("simple", device="cpu", preset="tiny", budget_s=600, out=tmp_path / "t")

    search = [c for c in calls if c["index"] > 0 and c["baseline"] == "eager"]
    assert len(search) >= 4, calls
    # No variant ran twice: a refinement is not queued again while its trial runs on the other
    # GPU (an H200 tune at 983fb19 ran one twice and reported a tie of the variant with itself).
    assert len({c["variant"] for c in search}) == len(search), [c["variant"] for c in search]
    # Every search trial was pinned to one of the two GPUs, and both were used.
    assert {c["gpu"] for c in search} == {0, 1}
    # Trials that ran at the same time never shared a GPU, and some did run at the same time.
    overlapping = [
        (a, b)
        for i, a in enumerate(search)
        for b in search[i + 1 :]
        if a["start"] < b["end"] and b["start"] < a["end"]
    ]
    assert overlapping, "no two search trials ran at once"
    assert all(a["gpu"] != b["gpu"] for a, b in overlapping)
    # The eager baseline ran first and alone (every candidate is compared with it).
    eager = next(c for c in calls if c["index"] == 0)
    assert all(c["start"] >= eager["end"] for c in calls if c is not eager)
    # The head-to-head trials, which decide the pick, ran one at a time and alone.
    h2h = [c for c in calls if c["baseline"] != "eager"]
    assert len(h2h) >= 2, calls
    assert not any(
        a is not b and a["start"] < b["end"] and b["start"] < a["end"] for a in h2h for b in calls
    )
    # Search trials side by side took turns on one lock file (one for the search); trials run
    # alone had none.
    assert all(c["host_lock"] for c in search)
    assert all(a["host_lock"] == b["host_lock"] for a, b in overlapping)
    assert all(c["host_lock"] is None for c in [*h2h, eager])
    # A search trial's own cap (its waits for the host not counted) sits within a wall limit
    # (the search's room, which counts them); every trial has both.
    assert all(c["wall_s"] is not None and c["timeout_s"] > 0 for c in calls)
    # Every trial kept its compile cache; each head-to-head trial was lent its two variants'
    # caches (the leader's and the challenger's search trials), kept where they ran.
    assert all(c["keep_cache"] for c in calls)
    by_variant = {c["variant"]: c for c in search}
    leader = doc["stages"]["head_to_head"]["leader"]
    for c in h2h:
        lent = c["lend_caches"]
        assert list(lent) == [by_variant[leader]["id"], by_variant[c["variant"]]["id"]]
        assert all(path.name == "compile-cache" and path.parent.name in lent
                   for path in lent.values())  # fmt: skip
    # The tune still ends with a pick and the head-to-head of its finalists.
    assert doc["selection"]["best"] is not None
    assert (tmp_path / "t" / "report.html").exists()


def test_on_one_gpu_the_pool_allows_its_compile_slots_to_every_trial(tmp_path, monkeypatch):
    from torchkiln.runner.launch.host_lock import compile_slots

    seen = []

    def fake_run_trial(spec, trial_dir, *, host_lock=None, **_):
        seen.append(None if host_lock is None else compile_slots(host_lock))
        result = _trial(spec.variant, 5.0, 2.0 if spec.index else 1.0, 1.0)
        result.update(id=spec.id, baseline=spec.baseline, process_wall_s=1.0)
        return result

    why = "4 at once, 2 compiling at most"
    monkeypatch.setattr(pipeline, "search_slots", lambda *a: ([None] * 4, why, 2))
    fake_tune_trials(monkeypatch, fake_run_trial)
    doc = pipeline.tune("simple", device="cpu", preset="tiny", budget_s=600, out=tmp_path / "t",
                        history=False)  # fmt: skip
    assert doc["stages"]["search"]["in_flight"] == {"trials": 4, "why": why, "compiles": 2}
    search = seen[1 : len(doc["trials"])]  # after the eager baseline, which runs alone
    assert search and all(n == 2 for n in search)


def test_a_dear_compile_starts_before_cheaper_candidates_when_trials_run_at_once(
    tmp_path, monkeypatch
):
    """With several trials in flight, a candidate priced at a third of the search's room or more
    (tune/queue.py DEAR_SHARE) starts once the primaries have, ahead of cheaper ones planned
    before it; with one trial at a time the plan order holds."""

    def fake_run_trial(spec, trial_dir, *, host_lock=None, **_):
        compiled = spec.variant.startswith("inductor")
        # 20 s: the estimator's unit before it learns one, so that the estimates do not depend
        # on which trials have ended when the diagnosis comes in.
        result = _trial(spec.variant, 5.0, 2.0 if spec.index else 1.0, 20.0 if compiled else 0.0)
        result.update(id=spec.id, baseline=spec.baseline, process_wall_s=1.0)
        return result

    class Started(pipeline.TuneEvents):
        def __init__(self):
            self.specs: list[str] = []

        def stage(self, name, detail, seconds_left):
            if name == "search" and " (of " in detail:
                self.specs.append(detail.split(" (of ")[0])

    fake_tune_trials(monkeypatch, fake_run_trial)
    # Priced from the start: the wait for a price has a test of its own (below).
    monkeypatch.setattr(pipeline.Estimator, "priced", lambda self, cand: True)
    dear = "inductor:mode=max-autotune-no-cudagraphs,fullgraph=true,dynamic=false"
    cheap = "inductor:dynamic=false+bf16"

    def started(slots: int, out: str) -> tuple[list[str], list[str]]:
        why = f"{slots} at once, {slots} compiling at most"
        monkeypatch.setattr(pipeline, "search_slots", lambda *a: ([None] * slots, why, slots))
        events = Started()
        doc = pipeline.tune("simple", device="cpu", preset="tiny", budget_s=900,
                            allow_precision={"bf16"}, out=tmp_path / out, events=events,
                            history=False)  # fmt: skip
        return doc["stages"]["search"]["planned"], events.specs

    planned, order = started(4, "four")
    # The plan has the cheap bf16 compile before max-autotune (priced at 15x a 20-s compile: 301 s
    # against about 800 s of room).
    assert planned.index(cheap) < planned.index(dear)
    assert order.index(dear) < order.index(cheap), order
    # The primary (planned before the diagnosis, without fullgraph) still went first.
    assert order[0] == "inductor:dynamic=false", order
    planned, order = started(2, "two")
    assert order.index(dear) < order.index(cheap), order
    planned, order = started(1, "one")
    assert order.index(cheap) < order.index(dear), order


def test_a_dear_compile_waits_for_the_first_compile_to_price_it(tmp_path, monkeypatch):
    """Before any compile of the tune has ended a dear candidate's estimate is a guess (the
    estimator's default unit), so while one is in flight it is held and cheaper candidates take
    the free places; once a compile ends and prices it, it starts ahead of those still waiting."""
    spans: dict[str, list[float]] = {}
    guard = threading.Lock()

    def fake_run_trial(spec, trial_dir, *, host_lock=None, **_):
        compiled = spec.variant.startswith("inductor")
        start = time.monotonic()
        time.sleep(0.4 if compiled else 0.0)
        with guard:
            spans[spec.variant] = [start, time.monotonic()]
        result = _trial(spec.variant, 5.0, 2.0 if spec.index else 1.0, 20.0 if compiled else 0.0)
        result.update(id=spec.id, baseline=spec.baseline, process_wall_s=1.0)
        return result

    fake_tune_trials(monkeypatch, fake_run_trial)
    why = "4 at once, 4 compiling at most"
    monkeypatch.setattr(pipeline, "search_slots", lambda *a: ([None] * 4, why, 4))
    doc = pipeline.tune("simple", device="cpu", preset="tiny", budget_s=900,
                        allow_precision={"bf16"}, out=tmp_path / "t", history=False)  # fmt: skip
    dear = "inductor:mode=max-autotune-no-cudagraphs,fullgraph=true,dynamic=false"
    planned = doc["stages"]["search"]["planned"]
    searched = [v for v in planned if v in spans]
    first_end = min(spans[v][1] for v in searched if v.startswith("inductor") and v != dear)
    # Held until a compile ended...
    assert spans[dear][0] >= first_end
    # ...while cheaper candidates planned after it started...
    assert any(spans[v][0] < first_end for v in planned[planned.index(dear) + 1 :] if v in spans), (
        spans
    )
    # ...and then ahead of one planned before it that was still waiting.
    assert any(
        spans[v][0] > spans[dear][0] for v in planned[: planned.index(dear)] if v in spans
    ), spans
