"""With several trials in flight, a tune's diagnosis (profile, explain, repair plan) runs beside
the search's first trials: the primaries start at once, the remedies are queued when the
diagnosis is in, and every timed interval stays alone on the host.

The trials and the diagnosis are fakes that take their turns on the lock file the pipeline
hands them, with the real HostLock (runner/launch/host_lock.py), and record when each phase ran
as the real worker does (``phase_at``, wall-clock seconds). The last tests run the real profile
worker on that lock."""

from __future__ import annotations

import fcntl
import threading
import time

import pytest

from tests_helpers import _trial
from torchkiln.diagnose import profile_worker
from torchkiln.runner.launch.host_lock import HostLock, host_turns, shared_turn
from torchkiln.tune import evidence, pipeline

FIXES = ["config:all", "config:capture_scalar_outputs"]


def _overlaps(a: list, b: list) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _fake_tune(tmp_path, monkeypatch, gpus: list, name: str) -> tuple[dict, dict]:
    """A tune of `simple` with fake trials and diagnosis; returns (results.json, what the
    fakes recorded)."""
    seen: dict = {"explain": None, "lock_paths": set()}
    guard = threading.Lock()

    def fake_run_trial(spec, trial_dir, *, timeout_s, wall_s=None, gpu=None, host_lock=None,
                       on_phase=None, cache_dir=None, keep_cache=False,
                       lend_caches=None):  # fmt: skip
        lock = HostLock(host_lock) if host_lock else None
        at: list = []

        def phase(name: str, seconds: float) -> None:
            asked = time.time()
            if lock is not None:
                lock.enter(name)  # first_call shares the host; measure has it alone
            began = time.time()
            if began - asked > 0.001:
                at.append(["host_wait", round(asked, 3), round(began, 3)])
            time.sleep(seconds)
            at.append([name, round(began, 3), round(time.time(), 3)])

        phase("build", 0.05)
        phase("first_call", 0.3)  # the compile
        phase("measure", 0.1)  # the timed reps
        if lock is not None:
            lock.close()
            with guard:
                seen["lock_paths"].add(host_lock)
        remedy = "+fix=" in spec.variant
        speedup = 1.0 if spec.variant == "eager" else (1.2 if remedy else 2.0 - 0.01 * spec.index)
        if spec.baseline != "eager":
            speedup = 0.9
        result = _trial(spec.variant, 10.0 / speedup, speedup, 0.0 if spec.index == 0 else 5.0)
        result.update(id=spec.id, baseline=spec.baseline, process_wall_s=0.5, phase_at=at)
        return result

    def fake_profile(spec, timeout_s, host_lock=None):
        # As the profile worker does: busy work on a shared turn, the timed steps exclusive.
        lock = HostLock(host_lock) if host_lock else None  # none before the search
        if lock is not None:
            lock.enter("start")
        time.sleep(0.1)
        if lock is not None:
            lock.hold(fcntl.LOCK_EX)
        began = time.time()
        time.sleep(0.2)
        timed = [round(began, 3), round(time.time(), 3)]
        if lock is not None:
            lock.close()
            seen["lock_paths"].add(host_lock)
        return {"status": "ok", "verdict": "balanced", "timed_at": timed}

    def fake_explain(spec, timeout_s):
        # As diagnose/_subproc.run_module does: a shared turn on KILN_HOST_TURNS's file, if set.
        with shared_turn(host_turns()):
            began = time.time()
            time.sleep(1.0)  # tracing and compiling, on the shared turn the pipeline holds
            seen["explain"] = [round(began, 3), round(time.time(), 3)]
        return {"status": "ok", "breaks": 2, "records": []}

    def fake_repair_plan(spec, found, fix, out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "plan.json"
        path.write_text("{}")
        plan = {"fixes": FIXES, "path": str(path), "breaks": [], "code": {}, "config": {}}
        return {"status": "ok", "mode": fix, "fixes": FIXES}, plan

    monkeypatch.setattr(pipeline, "run_trial", fake_run_trial)
    monkeypatch.setattr(pipeline, "visible_gpus", lambda device: gpus)
    monkeypatch.setattr(pipeline, "preflight", lambda *a, **k: {"ok": True})
    monkeypatch.setattr(evidence, "profile_verdict", fake_profile)
    monkeypatch.setattr(evidence, "graph_breaks", fake_explain)
    monkeypatch.setattr(evidence, "repair_plan", fake_repair_plan)
    monkeypatch.setenv("KILN_WARM_START", "0")
    doc = pipeline.tune(
        "simple", device="cpu", preset="tiny", budget_s=600, out=tmp_path / name, history=False
    )
    return doc, seen


def test_the_primaries_start_beside_the_diagnosis_and_no_timed_interval_overlaps(
    tmp_path, monkeypatch
):
    doc, seen = _fake_tune(tmp_path, monkeypatch, [0, 1, 2], "beside")
    stages = doc["stages"]
    profile, breaks, search = stages["profile"], stages["graph_breaks"], stages["search"]
    assert profile["beside"] == breaks["beside"] == "search"
    trials = [t for t in doc["trials"] if t["variant"] != "eager"]
    first = {t["variant"]: t["phase_at"][0][1] for t in trials}

    # A primary started before the explain stage ended; the remedies, which come from its
    # findings, were planned and started only after it.
    early = search["before_diagnosis"]["planned"]
    assert early and not any("+fix=" in s for s in early)
    assert any(first[s] < breaks["ended_at"] for s in early if s in first)
    remedies = [v for v in first if "+fix=" in v]
    assert remedies and all(first[v] >= breaks["ended_at"] for v in remedies)
    assert all(s in search["planned"] for s in remedies)
    assert search["before_diagnosis"]["waited_s"] >= 0

    # The diagnosis held one of the three places in flight: at most two trials beside it.
    spans = [[t["phase_at"][0][1], t["phase_at"][-1][2]] for t in trials]
    for at in (s[0] for s in spans if s[0] < breaks["ended_at"]):
        assert sum(s[0] <= at < s[1] for s in spans) <= 2

    # No timed interval beside another's work: a trial's reps against the profile's timed
    # steps, the explain stage's work and every other trial's compile and build; the
    # profile's timed steps against every trial's phases.
    assert seen["lock_paths"] and len(seen["lock_paths"]) == 1  # one lock file for all
    every = [*trials, *doc["head_to_head_trials"]]
    for t in trials:
        for name, start, end in t["phase_at"]:
            if name == "host_wait":
                continue
            if name == "measure":
                assert not _overlaps([start, end], profile["timed_at"]), t["variant"]
                assert not _overlaps([start, end], seen["explain"]), t["variant"]
            for other in every:
                if other is t:
                    continue
                for o_name, o_start, o_end in other.get("phase_at") or []:
                    if o_name == "host_wait":
                        continue
                    if name == "measure" or o_name == "measure":
                        assert not _overlaps([start, end], [o_start, o_end]), (t["id"], other["id"])
            if name != "measure":
                assert not _overlaps([start, end], profile["timed_at"]), (t["variant"], name)

    # The account: the diagnosis is beside the search, not a stage of the main line, and the
    # main line's stages add up to the wall.
    spent = doc["time_spent"]
    assert set(spent["beside_s"]) == {"profile", "graph breaks"}
    assert "profile" not in spent["stages_s"] and "graph breaks" not in spent["stages_s"]
    assert sum(spent["stages_s"].values()) == pytest.approx(spent["wall_s"], abs=0.5)
    assert spent["beside_s"]["graph breaks"] == pytest.approx(
        breaks["ended_at"] - breaks["started_at"], abs=0.05
    )
    assert doc["selection"]["best"] is not None


def test_with_host_turns_the_search_and_the_diagnosis_take_them_on_that_file(tmp_path, monkeypatch):
    turns = tmp_path / "turns.lock"
    monkeypatch.setenv("KILN_HOST_TURNS", str(turns))
    doc, seen = _fake_tune(tmp_path, monkeypatch, [0, 1, 2], "turns")
    assert seen["lock_paths"] == {str(turns)}
    assert turns.exists()  # the user's file, not the tune's to remove
    assert doc["stages"]["graph_breaks"]["beside"] == "search"
    assert doc["selection"]["best"] is not None


def test_results_keep_their_shape_with_the_diagnosis_beside_or_before(tmp_path, monkeypatch):
    beside, _ = _fake_tune(tmp_path, monkeypatch, [0, 1, 2], "beside")
    before, _ = _fake_tune(tmp_path, monkeypatch, [None], "before")  # one slot: in order
    assert "beside" not in before["stages"]["graph_breaks"]
    assert "before_diagnosis" not in before["stages"]["search"]
    assert "beside_s" not in before["time_spent"]
    assert {"profile", "graph breaks"} <= set(before["time_spent"]["stages_s"])
    assert set(beside) == set(before)
    assert set(beside["stages"]) == set(before["stages"])
    extra = {"before_diagnosis"}
    assert set(beside["stages"]["search"]) - extra == set(before["stages"]["search"])
    for key in ("profile", "graph_breaks"):
        assert set(beside["stages"][key]) - {"beside"} == set(before["stages"][key])
    # The same candidates planned, the remedies included, whichever way the stages ran.
    assert set(beside["stages"]["search"]["planned"]) == set(before["stages"]["search"]["planned"])
    assert {t["variant"] for t in beside["trials"]} == {t["variant"] for t in before["trials"]}


def test_zero_breaks_the_primary_measured_without_fullgraph_stands_for_its_twin():
    from torchkiln.tune.search import Evidence, after_diagnosis, candidates, early_plan

    before = Evidence(device="cuda", step="infer", allow_precision={"bf16"})
    early = [c.spec for c in early_plan(before)]
    after = Evidence(device="cuda", step="infer", allow_precision={"bf16"}, graph_breaks=0)
    rest, stand_for = after_diagnosis(early, candidates(after), after)
    assert sorted(stand_for.values()) == sorted(early)
    assert all("fullgraph=true" in k for k in stand_for)
    # The autotuned modes started early are stood for too: none is planned twice.
    assert sum("max-autotune" in s for s in stand_for.values()) == 2
    assert not {c.spec for c in rest} & (set(stand_for) | set(early))
    # With breaks nothing stands in: the plan's specs are the ones measured.
    broken = Evidence(device="cuda", step="infer", allow_precision={"bf16"}, graph_breaks=3)
    rest, stand_for = after_diagnosis(early, candidates(broken), broken)
    assert stand_for == {} and not {c.spec for c in rest} & set(early)


def test_the_profile_worker_times_its_steps_on_an_exclusive_turn(tmp_path):
    path = str(tmp_path / "host.lock")
    neighbour = HostLock(path)
    neighbour.enter("first_call")  # a neighbour compiling: a shared turn
    mine, result = HostLock(path), {}
    profile_worker.take_turn(mine, "build", result)  # busy work shares the host: no wait
    timed = threading.Thread(target=profile_worker.take_turn, args=(mine, "warmup", result))
    timed.start()
    timed.join(0.3)
    assert timed.is_alive()  # the timed steps wait for the neighbour's compile to end
    released = round(time.time(), 3)
    neighbour.enter("done")
    timed.join(10)
    assert not timed.is_alive()
    name, _, waited_until = result["phase_at"][-1]
    assert name == "host_wait" and waited_until >= released
    mine.close()
    neighbour.close()


def test_the_real_profile_worker_waits_for_a_neighbours_timed_reps(tmp_path):
    from torchkiln.diagnose.profile import run_profile

    path = str(tmp_path / "host.lock")
    neighbour = HostLock(path)
    neighbour.enter("measure")  # a neighbour timing its reps: the host is its alone
    released: list[float] = []

    def release() -> None:
        time.sleep(1.0)
        released.append(time.time())
        neighbour.enter("done")

    threading.Thread(target=release).start()
    doc = run_profile(
        "simple", device="cpu", preset="tiny", steps=2, count_flops=False, host_lock=path
    )
    neighbour.close()
    assert doc["status"] == "ok", doc.get("error")
    phases = [p for p in doc["phase_at"] if p[0] != "host_wait"]
    assert [p[0] for p in phases] == ["build", "warmup", "profile", "analyze"]
    assert all(start >= round(released[0], 3) for _, start, _ in phases)


def test_the_autotuned_modes_at_the_lead_precision_start_beside_the_diagnosis():
    """Besides the primaries, the search's longest compiles, max-autotune with and without CUDA
    graphs over the whole model at the lead precision, start before the diagnosis is in; on the
    CPU or with no 16-bit precision allowed only the primaries do."""
    from torchkiln.tune.search import Evidence, candidates, early_plan

    ev = Evidence(device="cuda", step="train", convolutional=True, allow_precision={"bf16"})
    early = [c.spec for c in early_plan(ev)]
    primaries = [c.spec for c in candidates(ev) if c.primary]
    assert early[: len(primaries)] == primaries
    assert early[len(primaries) :] == [
        "inductor:mode=max-autotune-no-cudagraphs,dynamic=false+bf16",
        "inductor:mode=max-autotune,dynamic=false+bf16",
    ]
    for other in (
        Evidence(device="cuda", step="train", convolutional=True),
        Evidence(device="cpu", step="infer", allow_precision={"bf16"}),
    ):
        assert [c.spec for c in early_plan(other)] == [
            c.spec for c in candidates(other) if c.primary
        ]
