"""Summaries of the GPU benchmark scripts, as pure functions over made-up documents (no trials
run): bench_tune.py's pick against the plain torch.compile modes (the ratios its goals are
judged on) and bench_dist.py's scaling rows with both one-process references."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run_benchmark(script: str, *args: str) -> subprocess.CompletedProcess:
    """A benchmarks/ script on the CPU, as the GPU plans run it (src on the path)."""
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )  # fmt: skip


def _load(name: str):
    """A benchmarks/ script imported as a module (its functions, not its main)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _script():
    return _load("bench_tune")


def _trial(variant, speedup, ci, status="ok", passed=True):
    return {
        "variant": variant,
        "status": status,
        "reason": None if status == "ok" else "boom",
        "correctness": {"passed": passed},
        "speedup": {"median": speedup, "ci95": list(ci)},
    }


def test_plain_specs_are_the_four_modes_at_one_precision():
    s = _script()
    assert s.plain_specs("fp32") == [
        "inductor",
        "inductor:mode=reduce-overhead",
        "inductor:mode=max-autotune-no-cudagraphs",
        "inductor:mode=max-autotune",
    ]
    assert s.plain_specs("bf16")[1] == "inductor:mode=reduce-overhead+bf16"


def test_pick_over_plain_inverts_the_paired_ratio_and_takes_the_closest_plain_mode():
    s = _script()
    doc = {
        "trials": [
            # Baseline = the pick: speedup = pick ms / plain ms.
            _trial("inductor+bf16", 0.5, (0.45, 0.55)),  # plain twice as slow as the pick
            _trial("inductor:mode=reduce-overhead+bf16", 0.8, (0.78, 0.82)),
            _trial("inductor:mode=max-autotune+bf16", 0.9, (0.8, 1.0), status="timeout"),
            _trial("inductor:mode=max-autotune-no-cudagraphs+bf16", 2.0, (1.9, 2.1), passed=False),
        ]
    }
    out = s.pick_over_plain(doc)
    assert out["best_plain"] == "inductor:mode=reduce-overhead+bf16"
    best = out["pick_over_best_plain"]
    assert best["ratio"] == pytest.approx(1.25)
    assert best["ci95"] == pytest.approx([1 / 0.82, 1 / 0.78])
    assert out["pick_over_plain"]["inductor+bf16"]["ratio"] == pytest.approx(2.0)
    # A trial that failed or computed something else cannot be the bar to beat.
    assert set(out["not_measured"]) == {
        "inductor:mode=max-autotune+bf16",
        "inductor:mode=max-autotune-no-cudagraphs+bf16",
    }
    # Stopped in its correctness check after its timing: still a bar the pick must clear
    # (the stricter comparison), and marked as unchecked.
    kept = {**_trial("inductor:mode=max-autotune+bf16", 0.9, (0.8, 1.0), status="timeout"),
            "measured_before_failure": True, "correctness": None}  # fmt: skip
    out = s.pick_over_plain({"trials": [*doc["trials"][:2], kept]})
    assert out["best_plain"] == "inductor:mode=max-autotune+bf16"
    assert out["pick_over_best_plain"]["ratio"] == pytest.approx(1 / 0.9)
    assert "not checked: timeout" in out["pick_over_best_plain"]["correctness"]
    assert out["not_measured"] == {}

    # Run without the check (--plain-no-check): counted and marked; a failed or wrong trial
    # still is not.
    unchecked = {**_trial("inductor:mode=max-autotune", 0.25, (0.24, 0.26)), "correctness": None}
    out = s.pick_over_plain({"trials": [unchecked, doc["trials"][2]]})
    assert out["pick_over_best_plain"]["ratio"] == pytest.approx(4.0)
    assert out["pick_over_best_plain"]["correctness"] == "not checked (--plain-no-check)"
    assert list(out["not_measured"]) == ["inductor:mode=max-autotune+bf16"]


def test_a_given_pick_is_summarised_without_a_tune():
    # --pick: the plain modes timed against an earlier tune's pick; no wall time to judge.
    s = _script()
    doc = s.given_pick("bert-base", "train", "inductor:mode=reduce-overhead+bf16")
    fp32 = {"pick_over_best_plain": {"ratio": 3.0, "ci95": [2.9, 3.1]},
            "not_measured": {"inductor:mode=max-autotune": "timeout"}}  # fmt: skip
    row = s.summarize_tune(doc, 900.0, None, fp32)
    assert row["pick"] == "inductor:mode=reduce-overhead+bf16"
    assert row["wall_s"] is None and row["within_budget"] is None
    assert row["pick_speedup_vs_eager"] is None and row["goal_train_1_2x"] is None
    assert row["fp32_reading"] == {"never_slower": True, "train_1_2x": True,
                                   "unmeasured_modes": ["inductor:mode=max-autotune"]}  # fmt: skip


def test_bench_tune_pick_takes_one_workload_and_step():
    out = _run_benchmark("bench_tune.py", "--pick", "inductor+bf16", "--steps", "infer,train")
    assert out.returncode == 2 and "--pick: give one --workloads and one --steps" in out.stderr


def test_goals_judge_the_best_plain_mode_and_the_budget():
    s = _script()
    doc = {
        "workload": "resnet50",
        "step": "train",
        "wall_s": 700.0,
        "selection": {"best": "inductor:mode=reduce-overhead,scope=step+bf16"},
        "stages": {"search": {"skipped": {}}},
        "trials": [_trial("inductor:mode=reduce-overhead,scope=step+bf16", 4.0, (3.9, 4.1))],
    }
    plain = {"pick_over_best_plain": {"ratio": 1.1, "ci95": [1.05, 1.15]}}
    row = s.summarize_tune(doc, 900.0, plain)
    assert row["within_budget"] is True and row["pick_speedup_vs_eager"]["median"] == 4.0
    assert row["goal_never_slower"] is True and row["goal_train_1_2x"] is False
    slower = {"pick_over_best_plain": {"ratio": 0.97, "ci95": [0.95, 0.99]}}
    row = s.summarize_tune({**doc, "wall_s": 901.0}, 900.0, slower)
    assert row["goal_never_slower"] is False and row["within_budget"] is False
    infer = s.summarize_tune({**doc, "step": "infer"}, 900.0, None)
    assert "goal_train_1_2x" not in infer and infer["goal_never_slower"] is None
    assert "plain_fp32" not in infer
    # The fp32 reading is reported beside the strict one, which still decides the goals.
    fp32 = {"pick_over_best_plain": {"ratio": 4.5, "ci95": [4.4, 4.6]}}
    row = s.summarize_tune(doc, 900.0, slower, fp32)
    assert row["fp32_reading"] == {"never_slower": True, "train_1_2x": True,
                                   "unmeasured_modes": []}  # fmt: skip
    assert row["goal_never_slower"] is False and row["goal_train_1_2x"] is False
    assert s.plain_specs("fp32", ("default", "reduce-overhead")) == [
        "inductor",
        "inductor:mode=reduce-overhead",
    ]


def test_dist_scaling_rows_carry_both_one_process_references():
    spec = importlib.util.spec_from_file_location("bench_dist", ROOT / "benchmarks/bench_dist.py")
    bench_dist = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_dist)
    ms = lambda m: {"median": m, "ci95": [m * 0.99, m * 1.01]}  # noqa: E731
    ddp = {
        "trials": [
            {
                "variant": "inductor+bf16",
                "status": "ok",
                "steady_ms": ms(40.0),
                "single_process": {"steady_ms": ms(30.0)},
                "scaling_efficiency": 0.75,
                "scaling_efficiency_ci95": [0.74, 0.76],
                "throughput_samples_s": 1600.0,
                "losses": {"match": True},
            },
            {"variant": "eager+bf16", "status": "timeout", "reason": "past 300 s"},
        ]
    }
    own = {"trials": [{"variant": "inductor+bf16", "status": "ok", "steady_ms": ms(20.0)}]}
    rows = {r["variant"]: r for r in bench_dist.scaling_rows("resnet50", 2, ddp, own)}
    ok = rows["inductor+bf16"]
    assert ok["scaling_efficiency"] == 0.75 and ok["one_process_ms"]["median"] == 30.0
    assert ok["one_process_own_ms"]["median"] == 20.0
    assert ok["scaling_efficiency_own_process"] == pytest.approx(0.5)
    failed = rows["eager+bf16"]
    assert failed["status"] == "timeout" and failed["scaling_efficiency"] is None
    assert failed["scaling_efficiency_own_process"] is None


def test_bench_zoo_aa_check_on_the_cpu_writes_its_verdict(tmp_path):
    """The A/A the GPU plans run, on the CPU's tiny preset, with a chosen variant: its verdict
    file is named for the variant and carries each instance pair's ratio."""
    pytest.importorskip("torchvision")  # the A/A check times resnet50
    proc = _run_benchmark(
        "bench_zoo.py",
        *("--out", str(tmp_path)),
        *"--device cpu --preset tiny --checks-only --aa --aa-spec eager --timeout 300".split(),
        # Few reps: the test is of the verdict's making, not of the CPU's noise.
        *"--aa-replicas 3 --aa-reps 8".split(),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdict = json.loads((tmp_path / "aa-resnet50-infer-eager.json").read_text())
    lo, hi = verdict["ci95"]
    assert lo <= verdict["speedup"] <= hi
    assert verdict["contains_1"] == (lo <= 1.0 <= hi)
    assert verdict["replicas"] == 3 and len(verdict["pair_ratios"]) == 3
    # The speedup is the pairs' geometric mean.
    r = verdict["pair_ratios"]
    assert verdict["speedup"] == pytest.approx((r[0] * r[1] * r[2]) ** (1 / 3))
    assert not (tmp_path / "aa_check.json").exists()


def test_bench_tune_rejects_an_unknown_plain_mode_before_tuning():
    # Checked at the start: a typo must not cost a 10-minute tune first.
    out = _run_benchmark("bench_tune.py", "--plain-modes", "reduce-overhead,turbo")
    assert out.returncode == 2
    assert "--plain-modes: unknown ['turbo']" in out.stderr and "== tune" not in out.stdout


def test_kernel_host_path_judges_the_paired_cache_ratio(capsys):
    spec = importlib.util.spec_from_file_location(
        "kernel_host_path", ROOT / "benchmarks/kernel_host_path.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    forward = {"call": "softmax", "dtype": "fp32", "host_us": 20.0, "host_us_cache_off": 40.0}
    # The medians alone read 0.50; the rounds' paired ratios (drift moving both) read 0.80.
    assert not module.judge_cache([{**forward, "cache_ratio": 0.80}])
    assert "20.0 /   40.0 = 0.80 FAIL" in capsys.readouterr().out
    assert module.judge_cache([{**forward, "cache_ratio": 0.70}])
    # A run saved before the rounds were paired: the ratio of its medians.
    assert module.judge_cache([forward])
    assert not module.judge_cache([{**forward, "host_us": 32.0}])
    # A backward call has no goal.
    assert module.judge_cache([{**forward, "call": "softmax bwd", "cache_ratio": 0.9}])


def test_a_stopped_plain_run_is_summarised_from_what_it_left(tmp_path):
    # --summarize: finished trials count; a trial dir without the launcher's result.json (its
    # launcher was gone: the trial's own file is not trusted) and a variant never started are
    # named as not measured.
    s = _script()
    run = tmp_path / "w-train-plain-fp32"
    done = {**_trial("inductor:mode=reduce-overhead", 0.2, (0.19, 0.21)), "correctness": None,
            "environment": {"kiln_git_sha": "abc"}}  # fmt: skip
    (run / "trials/00-ro").mkdir(parents=True)
    (run / "trials/00-ro/result.json").write_text(json.dumps(done))
    (run / "trials/01-ma").mkdir(parents=True)
    (run / "trials/01-ma/trial-result.json").write_text(json.dumps({"status": "ok"}))
    out = s.left_in(run, ["inductor:mode=reduce-overhead", "inductor:mode=max-autotune"])
    assert out["pick_over_best_plain"]["ratio"] == pytest.approx(5.0)
    assert list(out["not_measured"]) == ["inductor:mode=max-autotune"]
    assert out["environment"] == {"kiln_git_sha": "abc"}


def test_tune_reuse_check_judges_what_each_run_reused():
    check = _load("tune_reuse_check")

    def trial(i, device="cuda", reused=False, notes=()):
        return {"id": i, "variant": i[3:], "status": "ok", "device": device, "steady_ms": 1.0,
                "reused": reused, "notes": list(notes)}  # fmt: skip

    def run(rc, trials, on_disk, stopped=None, left=None):
        doc = None if trials is None else {"trials": trials, "selection": {"best": "x"}}
        return {"rc": rc, "wall_s": 9.0, "interrupted_at_s": 40.0 if stopped else None,
                "stopped_trial": stopped, "trial_processes_after": left, "doc": doc,
                "trials_on_disk": {t["id"]: t for t in on_disk}}  # fmt: skip

    stale = "not reused, as it was measured with other settings (device 'cpu' -> 'cuda')"
    a = run(0, [trial("00-eager", "cpu")], [trial("00-eager", "cpu")])
    b = run(130, None, [trial("00-eager", notes=[stale])], stopped="01-inductor", left=[])
    c_trials = [trial("00-eager", reused=True), trial("01-inductor"), trial("02-cudagraphs")]
    c = run(0, c_trials, c_trials)
    d_trials = [{**t, "reused": True} for t in c_trials] + [trial("03-inductor_mode_x")]
    d = run(0, d_trials, d_trials)
    assert all(check.judge(a, b, c, d).values())
    # Each way it can go wrong is caught.
    orphan = run(130, None, b["trials_on_disk"].values(), stopped="01-inductor", left=["w"])
    assert not check.judge(a, orphan, c, d)["B left no trial process running"]
    recorded = run(
        130, None, [*b["trials_on_disk"].values(), trial("01-inductor")], "01-inductor", []
    )
    judged = check.judge(a, recorded, c, d)
    assert not judged["B left the stopped trial unrecorded"]
    assert not judged["B saved what it finished, on cuda"]
    silent = run(130, None, [trial("00-eager")], stopped="01-inductor", left=[])
    assert not check.judge(a, silent, c, d)["B says why A's baseline was not reused"]
    c_took = run(0, [{**t, "reused": True} for t in c_trials], c_trials)
    judged = check.judge(a, b, c_took, d)
    assert not judged["C reused exactly what B finished"]
    assert not judged["C measured the stopped trial"]
    d_again = run(0, c_trials, c_trials)
    assert not check.judge(a, b, c, d_again)["D measured none of C's trials again"]


def test_tune_speed_judges_the_plan_the_overhead_the_aa_check_and_the_loop():
    ts = _load("bench_tune_speed")

    def trial(spec, status="ok", **kw):
        return {"variant": spec, "status": status, "speedup": {"median": 2.0}, **kw}

    doc = {
        "stages": {"search": {
            "planned": ["a+bf16", "b+bf16", "c", "d"],
            "skipped": {"d": "would not fit the budget"},
            "ruled_out": {"c": "cannot win: at fp32 ..."},
            "refined": [{"spec": "e+bf16"}],
        }},
        "trials": [trial("eager"), trial("a+bf16"), trial("b+bf16", "timeout", reason="timeout: x"),
                   trial("e+bf16")],
    }  # fmt: skip
    plan = ts.plan_account(doc)
    assert plan["counts"] == {"planned": 5, "measured": 2, "failed": 1, "skipped": 1,
                              "ruled_out": 1, "not_reached": 0}  # fmt: skip
    assert not plan["every_candidate_ran"]  # one skipped for time, one timed out
    doc["stages"]["search"]["skipped"] = {}
    doc["trials"][2] = trial("b+bf16")
    doc["stages"]["search"]["planned"].remove("d")
    assert ts.plan_account(doc)["every_candidate_ran"]  # the ruled-out one is no cut
    # Per trial: the process wall less its compile and its timed reps, and less its waits too.
    phases = {"first_call": 10.0, "measure": 3.0, "host_wait": 2.0, "setup": 1.0}
    timed = {"trials": [{**trial("a"), "id": "01-a", "phase_s": phases, "process_wall_s": 17.0}]}
    ov = ts.overheads(timed)
    assert (ov["median_outside_s"], ov["median_outside_excl_wait_s"]) == (4.0, 2.0)
    assert ov["goal_median_excl_wait_le_5s"] is True
    # A head-to-head's compiled baseline (the leader) compiles too: its first call is no overhead.
    h2h = {**timed["trials"][0], "baseline": "inductor:mode=reduce-overhead+bf16",
           "baseline_first_call_s": 1.5}  # fmt: skip
    eager_base = {**timed["trials"][0], "baseline": "eager", "baseline_first_call_s": 1.5}
    rows = ts.overheads({"trials": [eager_base], "head_to_head_trials": [h2h]})["trials"]
    assert [r["outside_excl_wait_s"] for r in rows] == [2.0, 0.5]
    # The A/A goal as stated: to two decimals the interval contains 1.00, median within 2%.
    assert ts.aa_holds(0.9990, [0.9985, 0.9996]) is True
    assert ts.aa_holds(0.985, [0.98, 0.99]) is False
    assert ts.aa_holds(1.0, None) is None
    # The loop against the arms' tune: only a tune that measured every arm is compared.
    arms = {"wall_s": 240.0, "plan": {"every_candidate_ran": True}, "aa": None}
    goals = ts.judge({"loop": {"complete": True, "wall_s": 254.0}, "arms:gpt2": arms})
    assert goals["e_arms_over_loop"]["goal"] is True
    assert abs(goals["e_arms_over_loop"]["ratio"] - 240 / 254) < 1e-9
    arms["plan"]["every_candidate_ran"] = False
    assert (
        ts.judge({"loop": {"complete": True, "wall_s": 254.0}, "arms:gpt2": arms})[
            "e_arms_over_loop"
        ]["goal"]
        is False
    )
    # The max-autotune candidates alone: whether they fit the budget is the bound on (a).
    alone = {"plan": {"every_candidate_ran": False}}
    goals = ts.judge({"autotuned:resnet50": alone})
    assert goals["resnet50"]["a_bound_autotuned_alone_fit"] is False
    assert "a_bound_autotuned_alone_fit" not in goals["gpt2"]
    assert all("max-autotune" in v for v in ts.AUTOTUNED["resnet50"])


def test_tune_speed_sets_each_trials_reading_beside_what_else_ran_during_its_reps():
    ts = _load("bench_tune_speed")
    busy = {"pid": 7, "name": "cc1plus", "cpu_s": 3.0, "ours": False}
    doc = {
        "trials": [
            {"id": "00-eager", "variant": "eager", "steady_ms": {"median": 29.0, "cv": 0.004},
             "host_load": {"during": {"other_cpus": 0.1, "own_cpus": 1.0, "top_others": [],
                                      "own_threads_top": []}}},
            {"id": "01-eager_bf16", "steady_ms": {"median": 14.3, "cv": 0.12},
             "host_load": {"during": {"other_cpus": 2.5, "own_cpus": 1.0, "top_others": [busy],
                                      "own_threads_top": [{"tid": 1, "cpu_s": 4.0}]}}},
            {"id": "02-old", "steady_ms": {"median": 3.0, "cv": 0.01}, "host_load": {}},
            {"id": "03-failed", "status": "timeout"},
            {"id": "04-reused", "reused": True, "steady_ms": {"median": 1.0, "cv": 0.0}},
        ],
        "head_to_head_trials": [],
    }  # fmt: skip
    rows = {r["id"]: r for r in ts.reps_host(doc)}
    assert set(rows) == {"00-eager", "01-eager_bf16", "02-old"}
    assert rows["00-eager"]["variant"] == "eager"
    assert rows["01-eager_bf16"]["other_cpus"] == 2.5
    assert rows["01-eager_bf16"]["busiest_other"] == busy
    assert rows["00-eager"]["busiest_other"] is None and rows["00-eager"]["cv"] == 0.004
    # A result from before the /proc reading: its numbers, nothing invented beside them.
    assert rows["02-old"]["other_cpus"] is None and rows["02-old"]["steady_ms"] == 3.0


def test_tune_speed_sets_each_arms_tune_step_over_the_loops():
    ts = _load("bench_tune_speed")
    loop = {
        "complete": True,
        "wall_s": 165.0,
        "arms": [
            {"spec": "eager+bf16", "result": {"median_ms": 11.33}},
            {"spec": "inductor+bf16", "result": {"median_ms": 3.31}},
            {"spec": "inductor:mode=max-autotune+bf16", "result": None},  # its process failed
        ],
    }
    arms = {
        "wall_s": 121.0,
        "reps_host": [
            {"variant": "eager+bf16", "steady_ms": 17.0, "timing_thread": {"runqueue_share": 0.2}},
            {"variant": "inductor+bf16", "steady_ms": 3.31, "timing_thread": None},
            {"variant": "inductor+bf16", "steady_ms": 9.9},  # the A/A repeat: the first counts
            {"variant": "inductor:mode=max-autotune+bf16", "steady_ms": 3.1},
        ],
    }
    steps = ts.judge({"loop": loop, "arms:gpt2": arms})["arms_step_over_loop"]
    assert set(steps) == {"eager+bf16", "inductor+bf16"}
    assert steps["eager+bf16"]["ratio"] == 17.0 / 11.33
    assert steps["eager+bf16"]["runqueue_share"] == 0.2
    assert steps["inductor+bf16"] == {
        "ratio": 1.0,
        "tune_ms": 3.31,
        "loop_ms": 3.31,
        "runqueue_share": None,
    }


def test_tune_speed_pauses_part_accounts_each_trials_pauses_waits_and_reps():
    ts = _load("bench_tune_speed")
    assert "max-autotune" in ts.PAUSES[0] and "pauses" in ts.PARTS
    doc = {
        "trials": [
            {"variant": ts.PAUSES[0], "status": "timeout", "reason": "no result after 222 s"},
            {
                "variant": ts.PAUSES[1],
                "status": "ok",
                "process_wall_s": 42.4,
                "first_call_s": 18.8,
                "phase_s": {"host_wait": 16.8},
                "phase_at": [["first_call", 1.0, 19.8], ["measure", 29.0, 33.3]],
                "steady_ms": {"median": 7.57},
            },
        ]
    }
    got = ts.pause_account(doc)
    assert got[ts.PAUSES[0]]["status"] == "timeout"
    assert got[ts.PAUSES[0]]["reason"] == "no result after 222 s"
    assert got[ts.PAUSES[1]]["measure_at"] == [[29.0, 33.3]]
    assert got[ts.PAUSES[1]]["host_wait_s"] == 16.8 and got[ts.PAUSES[1]]["median_ms"] == 7.57


def test_tune_speed_bounds_the_leaders_autotuned_refinement_by_its_compile_alone():
    ts = _load("bench_tune_speed")
    leader = "inductor:mode=reduce-overhead,dynamic=false,scope=step+bf16+channels_last"
    autotuned = ts.ALONE["resnet50"][0]
    doc = {
        "trials": [
            {"variant": "eager", "phase_at": [["start", 100.0, 100.5], ["measure", 101.0, 108.0]]},
            {"variant": leader, "status": "ok", "phase_at": [["start", 265.0, 266.0],
                                                            ["check", 330.0, 331.0]]},
            {"variant": "stopped", "status": "timeout"},
        ],
        "time_spent": {"stages_s": {"environment": 9.0, "baseline": 9.0, "search": 418.8}},
    }  # fmt: skip
    line = ts.timeline(doc)
    assert line == {"trials": {leader: [165.0, 231.0]}, "timed_s": {leader: 0.0},
                    "search_end_s": 427.8}  # fmt: skip
    t8 = {
        "timeline": line,
        "refined": [{"leader": leader, "spec": autotuned}, {"leader": leader, "spec": "other"}],
        "plan": {"skipped": {autotuned: "would not fit"}, "failed": {}},
    }
    bound = ts.refinement_bound(t8, {"first_call_s": {autotuned: 200.0}})
    assert bound[autotuned]["cannot_fit"] is True  # 231 + 200 > 427.8
    assert bound[autotuned]["leader_ended_s"] == 231.0 and "other" not in bound
    assert (
        ts.refinement_bound(t8, {"first_call_s": {autotuned: 190.0}})[autotuned]["cannot_fit"]
        is False
    )  # 231 + 190 < 427.8: some order could have fitted it
    goals = ts.judge({"tune8:resnet50": {**t8, "plan": {**t8["plan"], "every_candidate_ran": False,
                      "max_autotune_measured": False}, "overhead": {"goal_median_excl_wait_le_5s":
                      True}, "aa": {"median": 1.0, "ci95": [0.999, 1.001]}},
                      "alone:resnet50": {"first_call_s": {autotuned: 348.0}}})  # fmt: skip
    assert goals["resnet50"]["a_bound_refinements_cannot_fit"] is True
    # Stopped while compiling: its seconds so far are a lower bound, which serves as well.
    stopped = {"first_call_s": {autotuned: None}, "first_call_at_least_s": {autotuned: 430.0}}
    assert ts.refinement_bound(t8, stopped)[autotuned]["cannot_fit"] is True
    assert "alone:resnet50" in ts.PARTS


def test_tune_speed_bounds_a_base_autotuned_candidate_by_its_compile_and_the_timed_reps():
    ts = _load("bench_tune_speed")
    base = ts.ALONE_BASE["resnet50"][0]
    refinement = ts.ALONE["resnet50"][0]

    def trial(name: str, start: float, end: float, measure: float) -> dict:
        return {"variant": name, "status": "ok", "phase_s": {"measure": measure},
                "phase_at": [["start", start, start + 1], ["check", end - 1, end]]}  # fmt: skip

    doc = {
        "trials": [trial("eager", 0.0, 11.0, 3.5), trial("a", 11.3, 95.0, 4.0),
                   trial("b", 20.0, 236.0, 40.0)],
        "time_spent": {"stages_s": {"baseline": 12.2, "search": 401.2}},
    }  # fmt: skip
    line = ts.timeline(doc)
    # The baseline trial's reps come before the search: not counted.
    assert line["timed_s"] == {"a": 4.0, "b": 40.0} and line["search_end_s"] == 413.4
    t8 = {
        "timeline": line,
        "refined": [{"leader": "a", "spec": refinement}],
        "plan": {"failed": {base: "timeout", refinement: "timeout"}, "skipped": {},
                 "every_candidate_ran": False, "max_autotune_measured": False},
        "overhead": {"goal_median_excl_wait_le_5s": True},
        "aa": {"median": 1.0, "ci95": [0.999, 1.001]},
    }  # fmt: skip
    # 11.3 + 360 + 44 = 415.3 > 413.4; a refinement is bounded by its leader, not here.
    alone = {"first_call_s": {base: 360.0, refinement: 500.0}}
    bound = ts.base_bound(t8, alone)
    assert list(bound) == [base]
    assert bound[base]["least_search_s"] == 415.3 and bound[base]["cannot_fit"] is True
    assert ts.base_bound(t8, {"first_call_s": {base: 350.0}})[base]["cannot_fit"] is False
    stopped = {"first_call_s": {base: None}, "first_call_at_least_s": {base: 370.0}}
    assert ts.base_bound(t8, stopped)[base]["compile_alone_s"] == 370.0
    # With no graph break the tune measures the candidate without `fullgraph=true`.
    twin = base.replace("fullgraph=true,", "")
    t8_twin = {**t8, "plan": {**t8["plan"], "failed": {twin: "timeout"}}}
    assert ts.base_bound(t8_twin, alone)[twin]["cannot_fit"] is True
    goals = ts.judge({"tune8:resnet50": t8, "alone-base:resnet50": alone})
    assert goals["resnet50"]["a_bound_base_cannot_fit"] is True
    assert "alone-base:resnet50" in ts.PARTS


def test_launch_by_cpu_times_the_step_on_every_usable_cpu_and_restores_the_affinity(tmp_path):
    pytest.importorskip("transformers")  # plain_loop's gpt2
    lb = _load("launch_by_cpu")
    started = os.sched_getaffinity(0)
    out = tmp_path / "launch.json"
    argv = ["--out", str(out), "--device", "cpu", "--preset", "tiny"]
    assert lb.main([*argv, "--steps", "2", "--reps", "2", "--warm", "1", "--processes", "2"]) == 0
    assert os.sched_getaffinity(0) == started
    doc = json.loads(out.read_text())
    cpus = sorted(started)
    assert doc["cpus"] == cpus and doc["gpu"] is None
    # two sweeps, the second backward, each CPU timed in each; the start's affinity before and
    # after them
    assert len(doc["sweeps"]) == 2 and len(doc["unpinned"]) == 2
    assert list(doc["sweeps"][0]) == [str(c) for c in cpus]
    assert list(doc["sweeps"][1]) == [str(c) for c in reversed(cpus)]
    for sweep in doc["sweeps"]:
        for r in sweep.values():
            assert len(r["reps_ms"]) == 2 and r["median_ms"] > 0 and r["steal_share"] >= 0
    by_cpu = doc["by_cpu"]
    assert sorted(int(c) for c in by_cpu) == cpus
    assert min(r["over_fastest"] for r in by_cpu.values()) == 1.0
    assert all(r["core_id"] is not None for r in by_cpu.values())
    # Two fresh processes, unpinned: each one's step and the CPU its thread ran on.
    runs = doc["processes"]
    assert [r["rc"] for r in runs] == [0, 0]
    assert all(r["median_ms"] > 0 and len(r["reps_ms"]) == 5 and r["cpu"] in cpus for r in runs)
