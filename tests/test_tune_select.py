"""Selection on synthetic results: intervals decide, correctness gates, job length matters."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchkiln.tune.api import parse_budget
from torchkiln.tune.pipeline import refine
from torchkiln.tune.search import Candidate, Evidence, candidates, refinements
from torchkiln.tune.select import break_even_steps, finalists, select


def trial(variant, ms, ci, speedup, sp_ci, first_s, *, passed=True, status="ok", precision="fp32"):
    return {
        "variant": variant,
        "status": status,
        "reason": None if status == "ok" else "boom",
        "steady_ms": {"median": ms, "ci95": list(ci)},
        "baseline_ms": {"median": 10.0, "ci95": [9.9, 10.1]},
        "speedup": {
            "median": speedup,
            "ci95": list(sp_ci),
            "significant": not (sp_ci[0] <= 1.0 <= sp_ci[1]) and abs(speedup - 1) >= 0.01,
        },
        "first_call_s": first_s,
        "changes_numerics": precision != "fp32",
        "settings": {"precision": {"variant": precision}},
        "correctness": {"passed": passed, "worst_error_over_threshold": 0.4 if passed else 3.0},
    }


EAGER = trial("eager", 10.0, (9.9, 10.1), 1.0, (0.99, 1.01), 0.2)


def test_clear_winner_wins():
    a = trial("inductor", 5.0, (4.9, 5.1), 2.0, (1.95, 2.05), 20)
    b = trial("inductor:mode=reduce-overhead", 4.0, (3.9, 4.1), 2.5, (2.45, 2.55), 25)
    sel = select([EAGER, a, b], baseline=EAGER)
    assert sel.best["variant"] == "inductor:mode=reduce-overhead"
    assert not sel.tied
    assert sel.ranking[:2] == ["inductor:mode=reduce-overhead", "inductor"]


def test_overlapping_intervals_are_a_tie_won_by_the_cheaper_compile():
    a = trial("inductor", 5.0, (4.8, 5.2), 2.0, (1.9, 2.1), 20)
    b = trial("inductor:mode=max-autotune", 4.9, (4.7, 5.1), 2.05, (1.95, 2.15), 300)
    sel = select([EAGER, a, b], baseline=EAGER)
    assert sel.best["variant"] == "inductor"
    assert set(sel.tied) == {"inductor", "inductor:mode=max-autotune"}
    assert "tie" in sel.reason


def test_an_accuracy_failure_never_wins_however_fast():
    fast_wrong = trial(
        "perturb", 1.0, (0.9, 1.1), 10.0, (9.5, 10.5), 1, passed=False, status="accuracy_fail"
    )
    ok = trial("inductor", 5.0, (4.9, 5.1), 2.0, (1.95, 2.05), 20)
    sel = select([EAGER, fast_wrong, ok], baseline=EAGER)
    assert sel.best["variant"] == "inductor"
    assert "perturb" in sel.rejected


def test_numerics_changing_variants_need_permission_but_are_shown():
    bf16 = trial("inductor+bf16", 2.0, (1.9, 2.1), 5.0, (4.8, 5.2), 20, precision="bf16")
    fp32 = trial("inductor", 5.0, (4.9, 5.1), 2.0, (1.95, 2.05), 20)
    sel = select([EAGER, bf16, fp32], baseline=EAGER)
    assert sel.best["variant"] == "inductor"
    assert "not allowed" in sel.rejected["inductor+bf16"]
    assert sel.to_dict()["best_numerics_changing"]["variant"] == "inductor+bf16"
    allowed = select([EAGER, bf16, fp32], baseline=EAGER, allow_precision={"bf16"})
    assert allowed.best["variant"] == "inductor+bf16"


def test_a_short_job_picks_no_compilation():
    # 20 s of compile saves 5 ms a step: it pays back after 4,000 steps, not 10.
    comp = trial("inductor", 5.0, (4.9, 5.1), 2.0, (1.95, 2.05), 20.2)
    short = select([EAGER, comp], baseline=EAGER, steps=10)
    assert short.best["variant"] == "eager"
    long = select([EAGER, comp], baseline=EAGER, steps=100_000)
    assert long.best["variant"] == "inductor"
    assert break_even_steps(comp, EAGER) == pytest.approx(20.0 / 0.005)


def test_no_significant_speedup_never_breaks_even():
    same = trial("inductor", 9.99, (9.9, 10.1), 1.001, (0.99, 1.01), 20)
    assert break_even_steps(same, EAGER) is None


def test_nothing_passed():
    bad = trial("inductor", 5.0, (4.9, 5.1), 2.0, (1.95, 2.05), 20, status="compile_error")
    sel = select([bad], baseline=EAGER)
    assert sel.best is None and "compile_error" in sel.rejected["inductor"]


def test_search_is_ordered_by_the_profile_verdict_and_pruned_by_breaks():
    launch = candidates(
        Evidence(device="cuda", step="infer", verdict="host/launch-bound", graph_breaks=0)
    )
    assert "reduce-overhead" in launch[0].spec
    assert all("fullgraph=true" in c.spec for c in launch if c.spec.startswith("inductor"))
    broken = candidates(Evidence(device="cuda", step="infer", graph_breaks=3))
    assert not any("fullgraph" in c.spec for c in broken)
    cpu = candidates(Evidence(device="cpu", step="train", convolutional=True))
    assert not any("reduce-overhead" in c.spec or c.spec == "cudagraphs" for c in cpu)
    assert any("scope=step" in c.spec for c in cpu)
    train = candidates(Evidence(device="cuda", step="train", graph_breaks=0))
    steps = [c.spec for c in train if "scope=step" in c.spec]
    assert steps and not any("fullgraph=true" in s for s in steps)  # backward() breaks the graph
    assert any("fullgraph=true" in c.spec for c in train if "scope=" not in c.spec)
    assert any(c.spec.endswith("+channels_last") for c in cpu)
    assert not any("+bf16" in c.spec for c in cpu)
    bf16 = candidates(Evidence(device="cpu", step="infer", allow_precision={"bf16"}))
    assert any(c.spec.endswith("+bf16") for c in bf16)
    regions = candidates(Evidence(device="cuda", step="infer", has_repeated_blocks=True))
    assert any("scope=regions" in c.spec for c in regions)
    assert not any(c.spec == "xla" for c in regions)
    with_xla = candidates(Evidence(device="cpu", step="infer", xla_available=True))
    assert with_xla[-1].spec == "xla"  # tried last: long compiles, own process


@pytest.mark.parametrize(
    "text, seconds", [("15m", 900), ("90s", 90), ("1h30m", 5400), ("600", 600), (42, 42)]
)
def test_budget_parsing(text, seconds):
    assert parse_budget(text) == seconds


def test_bad_budget_is_refused():
    from torchkiln.errors import KilnUserError

    with pytest.raises(KilnUserError, match="15m"):
        parse_budget("soon")


def test_independent_trials_run_at_once_one_per_gpu_and_a_free_gpu_takes_the_next():
    import threading
    import time

    from torchkiln.runner.launch.executors import stream
    from torchkiln.runner.protocol.trial import TrialSpec

    started = threading.Barrier(2, timeout=10)  # the first two must run at the same time
    seen, events = [], []
    queue = ["slow", "fast"]

    def next_trial():
        return (
            (queue[0], TrialSpec(workload="w", variant=queue.pop(0), device="cuda"))
            if queue
            else None
        )

    def fake_run_one(spec, gpu, host_lock=None):
        if spec.variant in ("slow", "fast"):
            started.wait()
        events.append(("start", spec.variant, time.monotonic()))
        time.sleep({"slow": 1.0, "fast": 0.1}.get(spec.variant, 0.1))
        events.append(("end", spec.variant, time.monotonic()))
        return {"variant": spec.variant, "gpu": gpu, "host_lock": host_lock}

    def on_done(tag, result):
        seen.append((tag, result["gpu"], result["host_lock"]))
        if tag == "fast":  # a result can give the search more to run (a refinement)
            queue.append("after-fast")

    stream([0, 1], next_trial, fake_run_one, on_done)
    assert sorted(t for t, _, _ in seen) == ["after-fast", "fast", "slow"]
    assert {g for _, g, _ in seen} == {0, 1}
    # The refinement started on the GPU "fast" freed while "slow" still ran.
    at = {(kind, v): t for kind, v, t in events}
    assert at[("start", "after-fast")] < at[("end", "slow")]
    # All took turns on one lock file, removed afterwards.
    locks = {lock for _, _, lock in seen}
    assert len(locks) == 1 and not Path(locks.pop()).exists()


def test_one_slot_runs_trials_in_this_thread_one_after_another():
    import threading

    from torchkiln.runner.launch.executors import stream
    from torchkiln.runner.protocol.trial import TrialSpec

    queue, threads, order = ["a", "b"], [], []

    def next_trial():
        return (
            (queue[0], TrialSpec(workload="w", variant=queue.pop(0), device="cpu"))
            if queue
            else None
        )

    def run_one(spec, gpu, **lock):
        threads.append(threading.current_thread())
        assert not lock  # nothing to take turns with
        return {"variant": spec.variant}

    stream([None], next_trial, run_one, lambda tag, r: order.append(tag))
    assert order == ["a", "b"] and set(threads) == {threading.main_thread()}


def test_estimates_learn_from_measured_compile_times():
    from torchkiln.tune.limits import Estimator
    from torchkiln.tune.search import Candidate

    est = Estimator(overhead_s=10.0, default_compile_s=20.0)
    slow = Candidate("inductor:mode=max-autotune", "", 0, 5.0)
    assert est(slow) == 10.0 + 5.0 * 20.0
    est.learn(Candidate("inductor", "", 0, 1.0), {"status": "ok", "first_call_s": 4.0})
    assert est(slow) == 10.0 + 5.0 * 4.0


def test_estimates_are_learned_per_compile_family():
    """A regional compile prices regional candidates only; the whole-model plain compiles price
    the rest (numbers from an H200 resnet50 training tune, where regional compiles took twice
    the whole model's)."""
    from torchkiln.tune.limits import Estimator, compile_family
    from torchkiln.tune.search import Candidate

    est = Estimator(overhead_s=9.0)
    ok = {"status": "ok"}
    est.learn(Candidate("inductor:dynamic=false+bf16", "", 0, 1.0), ok | {"first_call_s": 33.0})
    est.learn(
        Candidate("inductor:mode=reduce-overhead,dynamic=false+bf16", "", 0, 1.1),
        ok | {"first_call_s": 33.0},
    )
    regions = "inductor:fullgraph=true,dynamic=false,scope=regions+bf16"
    est.learn(Candidate(regions, "", 0, 0.4), ok | {"first_call_s": 62.0})
    step = Candidate("inductor:mode=reduce-overhead,dynamic=false,scope=step+bf16", "", 0, 1.43)
    # The median of the plain whole-model units (33 and 30), not the regional one (155).
    assert est(step) == pytest.approx(9.0 + 1.43 * 31.5)
    ro_regions = "inductor:mode=reduce-overhead,fullgraph=true,dynamic=false,scope=regions+bf16"
    assert est(Candidate(ro_regions, "", 0, 0.44)) == pytest.approx(9.0 + 0.44 * 155.0)
    autotune = Candidate("inductor:mode=max-autotune,fullgraph=true,dynamic=false+bf16", "", 0, 8.8)
    assert est(autotune) == pytest.approx(9.0 + 8.8 * 31.5)
    assert compile_family(regions) == "plain-regions"
    assert compile_family("inductor:mode=max-autotune-no-cudagraphs+bf16") == "autotune-16"
    assert compile_family("inductor:mode=max-autotune") == "autotune-32"
    assert compile_family("cudagraphs+bf16") == "cudagraphs"


def test_a_candidate_is_priced_once_a_compile_of_its_family_or_a_plain_one_ends():
    from torchkiln.tune.limits import Estimator
    from torchkiln.tune.search import Candidate

    est = Estimator(overhead_s=9.0)
    autotune = Candidate("inductor:mode=max-autotune,dynamic=false+bf16", "", 0, 8.8)
    assert not est.priced(autotune)  # the default unit's guess
    # A regional compile prices regional candidates, not a whole-model autotuned one.
    est.learn(Candidate("inductor:dynamic=false,scope=regions+bf16", "", 0, 0.4),
              {"status": "ok", "first_call_s": 60.0})  # fmt: skip
    assert not est.priced(autotune)
    est.learn(Candidate("inductor:dynamic=false+bf16", "", 0, 1.0),
              {"status": "ok", "first_call_s": 60.0})  # fmt: skip
    assert est.priced(autotune)
    stopped = Estimator(overhead_s=9.0)
    stopped.learn(autotune, {"status": "timeout", "phase": "first_call", "process_wall_s": 300.0})
    assert stopped.priced(autotune)


def test_a_compile_stopped_while_compiling_is_a_lower_bound_for_its_family():
    from torchkiln.tune.limits import Estimator
    from torchkiln.tune.search import Candidate

    est = Estimator(overhead_s=9.0, default_compile_s=33.0)
    no_cg = "inductor:mode=max-autotune-no-cudagraphs,fullgraph=true,dynamic=false+bf16"
    stopped = {"status": "timeout", "phase": "first_call", "process_wall_s": 330.0}
    est.learn(Candidate(no_cg, "", 0, 8.0), stopped)
    layout = Candidate("inductor:mode=max-autotune,dynamic=false+bf16+channels_last", "", 0, 8.8)
    assert est(layout) == 330.0  # not 9 + 8.8 * 33 = 299
    # Another family is not bounded by it, nor is a trial stopped after its compile.
    assert est(Candidate("inductor:dynamic=false+bf16", "", 0, 1.0)) == 9.0 + 33.0
    fp32 = Candidate("inductor:mode=max-autotune,dynamic=false", "", 0, 16.5)
    assert est(fp32) == pytest.approx(9.0 + 16.5 * 33.0)
    hung = {"status": "timeout", "phase": "measure", "process_wall_s": 900.0}
    est.learn(Candidate("inductor:dynamic=false+bf16", "", 0, 1.0), hung)
    assert est(Candidate("inductor:mode=reduce-overhead+bf16", "", 0, 1.1)) == 9.0 + 1.1 * 33.0


def test_the_baseline_s_wall_as_a_yardstick_leaves_out_what_it_paid_for_the_others():
    from torchkiln.tune.limits import trial_wall_s

    assert trial_wall_s({"process_wall_s": 28.0, "phase_s": {"fixed_costs": 3.0}}) == 25.0
    assert trial_wall_s({"process_wall_s": 28.0, "phase_s": {"flops": 3.0}}) == 28.0


@pytest.mark.parametrize(
    "device, allowed, conv, expected",
    [
        # The plan's precisions; channels-last at fp32 and the lead precision.
        ("cuda", {"bf16"}, True, [["bf16", False], ["bf16", True], ["fp32", True]]),
        ("cuda", {"bf16", "tf32"}, True,
         [["bf16", False], ["bf16", True], ["fp32", True], ["tf32", False]]),
        ("cuda", set(), False, [["fp32", True]]),
        ("cpu", {"bf16"}, True, [["bf16", False], ["fp32", True]]),  # no lead on the CPU
    ],
)  # fmt: skip
def test_the_fixed_cost_pairs_cover_every_candidate_the_plan_has(device, allowed, conv, expected):
    from torchkiln.tune.search import fixed_cost_pairs
    from torchkiln.variants import parse_variant

    pairs = fixed_cost_pairs(device, allowed)
    assert pairs == expected
    ev = Evidence(device=device, step="infer", convolutional=conv, allow_precision=allowed)
    planned = {
        (v.precision, v.channels_last) for v in map(parse_variant, (c.spec for c in candidates(ev)))
    }
    assert planned - {("fp32", False)} <= {tuple(p) for p in pairs}


def test_a_given_plan_s_fixed_cost_pairs_are_its_own():
    from torchkiln.tune.search import fixed_cost_pairs, given_plan

    given = given_plan(["eager+bf16", "inductor", "inductor:mode=max-autotune+bf16+channels_last"])
    assert fixed_cost_pairs("cuda", {"bf16", "fp16"}, given) == [["bf16", False], ["bf16", True]]


# On the H200 (kiln d08ad43), resnet50 infer bf16: reduce-overhead ran 1.80 ms and max-autotune
# 3.48 ms, but their speedups over eager (host-bound, 4.96 and 9.54 ms in their trials) read
# 2.75x and 2.71x. Cross-trial speedups cannot separate them; a head-to-head trial can.
RO = trial("inductor:mode=reduce-overhead+bf16", 1.80, (1.79, 1.81), 2.75, (2.66, 2.86), 13.4,
           precision="bf16")  # fmt: skip
MA = trial("inductor:mode=max-autotune-no-cudagraphs+bf16", 3.48, (3.46, 3.50), 2.71,
           (2.65, 2.86), 262.0, precision="bf16")  # fmt: skip
DEF = trial("inductor+bf16", 4.25, (4.2, 4.3), 2.05, (1.86, 2.10), 14.5, precision="bf16")


def h2h(challenger, leader, speedup, ci):
    """A trial of ``challenger`` with ``leader`` as its baseline: speedup = leader / challenger."""
    t = trial(challenger["variant"], 1.0, (1.0, 1.0), speedup, ci, 99.0)
    t["baseline"] = leader["variant"]
    return t


def test_finalists_are_the_leader_the_next_by_speedup_and_the_fastest_by_time():
    slow_but_high = trial("a", 6.0, (5.9, 6.1), 3.0, (2.9, 3.1), 10)  # a lucky eager pairing
    # (fp32: allowed whatever --allow-precision says)
    fin = finalists([EAGER, slow_but_high, RO, MA, DEF], EAGER, {"bf16"})
    assert [f["variant"] for f in fin] == ["a", RO["variant"]]  # next by speedup = fastest
    fin = finalists([EAGER, RO, MA, DEF], EAGER, {"bf16"})
    assert [f["variant"] for f in fin] == [RO["variant"], MA["variant"]]
    # Numerics-changing variants not allowed, failures and eager itself never reach the final.
    assert finalists([EAGER, RO, MA, DEF], EAGER, set()) == []
    wrong = trial("w", 0.5, (0.5, 0.5), 9.0, (8.9, 9.1), 1, passed=False, status="accuracy_fail")
    assert wrong not in finalists([EAGER, wrong, RO, MA], EAGER, {"bf16"})


def test_a_challenger_faster_head_to_head_takes_the_pick():
    # MA leads on speedup by a lucky pairing; head to head, RO is 1.93x faster.
    lucky_ma = dict(MA, speedup={"median": 2.9, "ci95": [2.85, 2.95], "significant": True})
    sel = select([EAGER, lucky_ma, RO], baseline=EAGER, allow_precision={"bf16"},
                 head_to_head={RO["variant"]: h2h(RO, lucky_ma, 1.93, (1.91, 1.95))})  # fmt: skip
    assert sel.best["variant"] == RO["variant"]
    assert "head to head" in sel.reason and "1.93x" in sel.reason
    assert sel.head_to_head[RO["variant"]]["leader"] == MA["variant"]


def test_no_difference_head_to_head_is_a_tie_won_by_the_cheaper_compile():
    sel = select([EAGER, MA, RO], baseline=EAGER, allow_precision={"bf16"},
                 head_to_head={MA["variant"]: h2h(MA, RO, 1.004, (0.99, 1.02))})  # fmt: skip
    assert sel.best["variant"] == RO["variant"]  # 13.4 s first call against 262 s
    assert set(sel.tied) == {RO["variant"], MA["variant"]}
    assert "tie head to head" in sel.reason


def test_a_leader_faster_head_to_head_keeps_the_pick_even_where_intervals_overlapped():
    # Cross-trial intervals overlap (2.66-2.86 vs 2.65-2.86): without the head-to-head this
    # would be a tie won by... RO anyway; make the slower one the cheaper to compile instead.
    cheap_ma = dict(MA, first_call_s=5.0)
    plain = select([EAGER, cheap_ma, RO], baseline=EAGER, allow_precision={"bf16"})
    assert plain.best["variant"] == MA["variant"] and plain.tied  # the drift-fooled answer
    sel = select([EAGER, cheap_ma, RO], baseline=EAGER, allow_precision={"bf16"},
                 head_to_head={MA["variant"]: h2h(MA, RO, 0.52, (0.51, 0.53))})  # fmt: skip
    assert sel.best["variant"] == RO["variant"] and not sel.tied
    assert "faster head to head" in sel.reason


def test_head_to_head_trials_against_another_leader_or_failed_are_ignored():
    failed = dict(h2h(MA, RO, 2.0, (1.9, 2.1)), status="timeout")
    other = h2h(MA, DEF, 2.0, (1.9, 2.1))
    for h in (failed, other):
        sel = select([EAGER, MA, RO], baseline=EAGER, allow_precision={"bf16"},
                     head_to_head={MA["variant"]: h})  # fmt: skip
        assert not sel.head_to_head  # fell back to the cross-trial rule
        assert "head to head" not in sel.reason


def test_the_leader_is_refined_with_the_knobs_measured_only_apart():
    """With bf16 allowed the plan has reduce-overhead+bf16 and reduce-overhead+channels_last but
    not both; the leader gets each missing knob, cheapest first, autotuning last."""
    ev = Evidence(device="cuda", step="train", convolutional=True, allow_precision={"bf16"})
    ro_bf16 = "inductor:mode=reduce-overhead,dynamic=false+bf16"
    specs = [c.spec for c in refinements(ro_bf16, ev)]
    # The whole step under CUDA graphs too (the optimizer's state is made before capture).
    assert specs == [
        "inductor:mode=reduce-overhead,dynamic=false+bf16+channels_last",
        "inductor:mode=reduce-overhead,dynamic=false,scope=step+bf16",
        "inductor:mode=max-autotune,dynamic=false+bf16",
    ]
    assert [c.spec for c in refinements(specs[0], ev)] == [
        "inductor:mode=reduce-overhead,dynamic=false,scope=step+bf16+channels_last",
        "inductor:mode=max-autotune,dynamic=false+bf16+channels_last",
    ]
    # A whole-step leader is not re-scoped; it is autotuned over the whole step.
    assert [c.spec for c in refinements(specs[1], Evidence(device="cuda", step="train"))] == [
        "inductor:mode=max-autotune,dynamic=false,scope=step+bf16",
    ]
    default_bf16 = "inductor:dynamic=false+bf16"
    assert [c.spec for c in refinements(default_bf16, ev)] == [
        "inductor:dynamic=false+bf16+channels_last",
        "inductor:dynamic=false,scope=step+bf16",
        "inductor:mode=max-autotune-no-cudagraphs,dynamic=false+bf16",
    ]
    # Inference, no convolutions: the weights frozen, then the autotuned mode; fp32 is autotuned
    # by the plan itself.
    infer = Evidence(device="cuda", step="infer")
    frozen = "inductor:mode=reduce-overhead,dynamic=false,freezing=true+bf16"
    assert [c.spec for c in refinements(ro_bf16, infer)] == [
        frozen,
        "inductor:mode=max-autotune,dynamic=false+bf16",
    ]
    assert [c.spec for c in refinements("inductor:mode=reduce-overhead,dynamic=false", infer)] == [
        "inductor:mode=reduce-overhead,dynamic=false,freezing=true"
    ]
    # Frozen already, it is not frozen again; training never is (it changes the weights).
    assert [c.spec for c in refinements(frozen, infer)] == [
        "inductor:mode=max-autotune,dynamic=false,freezing=true+bf16"
    ]
    assert not any("freezing" in c.spec for c in refinements(ro_bf16, ev))
    assert [c.spec for c in refinements("inductor:mode=max-autotune", ev)] == [
        "inductor:mode=max-autotune+channels_last"
    ]
    assert refinements("cudagraphs", ev) == []


def test_refine_queues_one_refinement_of_the_leader_at_a_time_and_never_repeats_one():
    ev = Evidence(device="cuda", step="train", convolutional=True, allow_precision={"bf16"})
    lead = "inductor:dynamic=false+bf16"
    cl = "inductor:dynamic=false+bf16+channels_last"
    step = "inductor:dynamic=false,scope=step+bf16"
    results = [
        EAGER,
        trial("inductor:dynamic=false", 8.0, (7.9, 8.1), 1.25, (1.2, 1.3), 20),
        trial(lead, 2.5, (2.4, 2.6), 4.0, (3.9, 4.1), 25, precision="bf16"),
    ]
    later = Candidate("cudagraphs", "later", 6.0, 0.5)
    planned_cl = Candidate(cl, "planned", 1.5, 1.1)
    pending = [(5, later), (6, planned_cl)]
    search = {"skipped": {}, "refined": []}
    nxt = refine(results, EAGER, ev, pending, search, next_index=7)
    # The planned channels_last candidate moved up, with its own index; nothing else yet.
    assert [(i, c.spec) for i, c in pending] == [(6, cl), (5, "cudagraphs")] and nxt == 7
    # Called again before it ran: not queued or recorded twice.
    nxt = refine(results, EAGER, ev, pending, search, next_index=nxt)
    assert [c.spec for _, c in pending] == [cl, "cudagraphs"] and nxt == 7
    # Started on one GPU, no result yet, when another GPU's trial ends: not queued again (two
    # H200s once ran one refinement twice, kiln 983fb19); the leader's next one comes instead.
    pending.pop(0)
    in_flight = [list(p) for p in pending]
    refine(results, EAGER, ev, pending, search, next_index=nxt, running={cl})
    assert cl not in [c.spec for _, c in pending]
    assert [c.spec for _, c in pending] == [step, "cudagraphs"]
    pending[:] = [tuple(p) for p in in_flight]  # (the rest of this test runs one GPU)
    # It ran and did not lead: the leader's next refinement comes, with a new index.
    results.append(trial(cl, 2.6, (2.5, 2.7), 3.9, (3.8, 4.0), 30, precision="bf16"))
    nxt = refine(results, EAGER, ev, pending, search, next_index=nxt)
    assert [(i, c.spec) for i, c in pending] == [(7, step), (5, "cudagraphs")] and nxt == 8
    assert [r["spec"] for r in search["refined"]] == [cl, step]
    assert {r["leader"] for r in search["refined"]} == {lead}
    # It led: its own refinements come next, not the old leader's autotuned mode.
    pending.pop(0)
    results.append(trial(step, 2.2, (2.1, 2.3), 4.6, (4.5, 4.7), 30, precision="bf16"))
    refine(results, EAGER, ev, pending, search, next_index=nxt)
    assert pending[0][1].spec == "inductor:dynamic=false,scope=step+bf16+channels_last"
    # Skipped for the budget counts as tried.
    search["skipped"][pending.pop(0)[1].spec] = "would not fit the budget"
    refine(results, EAGER, ev, pending, search, next_index=nxt)
    assert (
        pending[0][1].spec
        == "inductor:mode=max-autotune-no-cudagraphs,dynamic=false,scope=step+bf16"
    )


def test_a_numerics_changing_leader_is_refined_only_when_its_precision_is_allowed():
    ev = Evidence(device="cuda", step="infer", convolutional=True)  # bf16 not allowed
    bf16 = trial("inductor:dynamic=false+bf16", 2.0, (1.9, 2.1), 5.0, (4.9, 5.1), 20,
                 precision="bf16")  # fmt: skip
    fp32 = trial("inductor:dynamic=false", 8.0, (7.9, 8.1), 1.25, (1.2, 1.3), 20)
    pending = []
    search = {"skipped": {}, "refined": []}
    refine([EAGER, bf16, fp32], EAGER, ev, pending, search, next_index=3)
    assert [c.spec for _, c in pending] == ["inductor:dynamic=false+channels_last"]


def test_an_allowed_precision_goes_before_fp32_autotuning_on_a_compute_bound_step():
    ev = Evidence(device="cuda", step="train", verdict="gpu-compute-bound", graph_breaks=0)
    fp32_plan = candidates(ev)
    fp32_only = [c.spec for c in fp32_plan]
    # The cheap plain modes first (the yardsticks), then autotuning ahead of the rest.
    assert [c.primary for c in fp32_plan[:3]] == [True, True, False]
    assert fp32_only[2].startswith("inductor:mode=max-autotune-no-cudagraphs")
    ev.allow_precision = {"bf16"}
    order = [c.spec for c in candidates(ev)]
    bf16 = [i for i, s in enumerate(order) if s.endswith("+bf16")]
    fp32 = [i for i, s in enumerate(order) if "+" not in s]
    assert bf16 and fp32 and max(bf16) < min(fp32)


def test_an_allowed_precision_leads_every_gpu_search_and_fp32_follows():
    """An H200 bert-base train tune at 4a03791 (launch-bound, bf16 allowed) spent its budget on fp32
    candidates; now the verdict orders the bf16 ones and each fp32 twin comes after them all."""
    ev = Evidence(device="cuda", step="train", verdict="host/launch-bound", graph_breaks=0,
                  has_repeated_blocks=True, allow_precision={"bf16"})  # fmt: skip
    plan = candidates(ev)
    specs = [c.spec for c in plan]
    assert specs[0] == "inductor:mode=reduce-overhead,fullgraph=true,dynamic=false+bf16"
    first_fp32 = min(i for i, s in enumerate(specs) if "+" not in s)
    assert all(s.endswith("+bf16") for s in specs[:first_fp32])
    assert "inductor:mode=reduce-overhead,fullgraph=true,dynamic=false" in specs[first_fp32:]
    # The whole step is compiled only without CUDA graphs (it failed under them on the H200).
    steps = [s for s in specs if "scope=step" in s]
    assert steps and not any("reduce-overhead" in s or "max-autotune" in s for s in steps)
    # An autotuned mode costs less to compile at bf16 than at fp32 (the zoo's medians).
    factor = {c.spec: c.compile_factor for c in plan}
    ma = "inductor:mode=max-autotune,fullgraph=true,dynamic=false"
    assert factor[ma + "+bf16"] < factor[ma]
    # On the CPU each precision stays a candidate of its own.
    cpu = [c.spec for c in candidates(Evidence(device="cpu", step="infer",
                                                allow_precision={"bf16"}))]  # fmt: skip
    assert cpu[0] == "inductor:dynamic=false" and "inductor:dynamic=false+bf16" in cpu


def test_a_search_trial_is_capped_at_a_multiple_of_its_estimate():
    from torchkiln.tune.limits import TRIAL_CAP_FACTOR, TRIAL_CAP_MIN_S, trial_cap_s

    assert trial_cap_s(10.0) == TRIAL_CAP_MIN_S
    assert trial_cap_s(400.0) == pytest.approx(400.0 * TRIAL_CAP_FACTOR)


def test_the_search_keeps_time_for_the_head_to_head_stage():
    from torchkiln.tune.limits import (
        H2H_COST_FACTOR,
        H2H_RESERVE_SHARE,
        LENT_FIRST_CALL_SHARE,
        head_to_head_cost,
        head_to_head_reserve,
    )

    eager = {**EAGER, "process_wall_s": 20.0}
    # Nothing compiled yet: two eager processes' worth per compiled arm.
    assert head_to_head_reserve([eager], 600, eager) == pytest.approx(80.0)

    def measured(variant, ms, speedup, wall, start, checks):
        r = trial(variant, ms, (ms * 0.99, ms * 1.01), speedup, (speedup * 0.98, speedup * 1.02), 9)
        phases = {"start": start, "first_call": 9.0, "correctness_compile": checks}
        # 4 s of interpreter and imports before the worker's clock starts.
        return {**r, "process_wall_s": wall, "wall_s": wall - 4.0, "phase_s": phases}

    a = measured("a", 5.0, 2.0, 99.0, 10.0, 30.0)  # the leader
    b = measured("b", 6.0, 1.7, 55.0, 12.0, 10.0)  # the next by speedup
    # Each arm loads its search trial's compiled code from the cache it kept: a quarter of its
    # 9 s compile (LENT_FIRST_CALL_SHARE) instead of all of it.
    assert LENT_FIRST_CALL_SHARE == 0.25
    lent = 0.75 * 9.0
    # One measured: twice its process time without what a head-to-head does not repeat.
    assert head_to_head_reserve([eager, a], 600, eager) == pytest.approx(2 * (69.0 - lent))
    # Both arms in one process that starts once: 69 + 45 - (4 + 10) (an H200 tune's 62 + 41 s
    # arms, one start of about 14 s: its head-to-head took 73 s), less the compiles the lent
    # caches spare, scaled to what such trials took on the H200.
    assert H2H_COST_FACTOR == 0.85
    both = 0.85 * (100.0 - 2 * lent)
    assert head_to_head_cost(a, b) == pytest.approx(both)
    # A search trial that waited for the host beside a neighbour: the head-to-head, alone after
    # the search, does not wait (H200, 983fb19: 42.8 s of a 199 s estimate).
    phases = {**a["phase_s"], "host_wait": 40.0}
    waited = {**a, "process_wall_s": 139.0, "wall_s": 135.0, "phase_s": phases}
    assert head_to_head_cost(waited, b) == pytest.approx(both)
    # A search trial reused from an earlier run kept no cache for its arm: its compile counts.
    assert head_to_head_cost({**a, "reused": True}, b) == pytest.approx(both + 0.85 * lent)
    slow = measured("slow", 9.0, 1.1, 149.0, 14.0, 32.0)  # slow to build, not a finalist
    failed = {**measured("d", 1.0, 9.0, 315.0, 10.0, 0.0), "status": "timeout"}
    runs = [eager, a, b, slow, failed]
    # The finalists' cost, not the slowest trials' (149 + 99 s in an H200 tune at bb4a839).
    assert head_to_head_reserve(runs, 600, eager) == pytest.approx(both)
    assert head_to_head_reserve(runs, 200, eager) == pytest.approx(H2H_RESERVE_SHARE * 200)


def test_a_trial_capped_by_the_budget_stops_early_enough_to_keep_the_reserve():
    """On the H200 (b2eb8b8) a trial stopped exactly where the search's share ended overran it
    by the seconds its stop took, and the head-to-head it left time for missed by about 1 s."""
    from torchkiln.tune.limits import TRIAL_CAP_MIN_S, TRIAL_STOP_S, search_limits

    # Plenty of room: the trial's own cap (at least TRIAL_CAP_MIN_S) within the search's room.
    assert search_limits(30.0, 400.0) == (TRIAL_CAP_MIN_S, 400.0 - TRIAL_STOP_S)
    # Room for less than its cap: its wall limit ends TRIAL_STOP_S before the search's share.
    own, wall = search_limits(60.0, 87.0)
    assert own == 180.0 and wall == pytest.approx(87.0 - TRIAL_STOP_S)  # 3x its 60 s
    # No room at all: a 1 s limit (the trial reports a timeout), never a negative one.
    assert search_limits(60.0, 4.0)[1] == 1.0
    # A candidate the search lets start (its estimate within search_room) is never given less
    # time than its estimate (a CPU tune once started eager+bf16 with a 1 s limit).
    from torchkiln.tune.limits import search_room

    for left in (5.0, 11.0, 40.0, 87.0, 400.0):
        for need in (0.5, 8.0, 30.0, 77.0):
            if need <= search_room(left):
                assert min(search_limits(need, left)) >= need


def test_a_stopped_trial_is_told_which_limit_stopped_it():
    """bert-base training on two H200s (94c62e6): a trial's reason has to say whether its own
    cap (waits for the host not counted) or the search's share of the budget ended it."""
    from torchkiln.tune.limits import BUDGET_CAP_NOTE, CAP_NOTE, stop_note

    assert stop_note("own", own_s=120.0, wall_s=300.0, limit_s=400.0) == CAP_NOTE
    assert stop_note("wall", own_s=120.0, wall_s=77.0, limit_s=400.0) == BUDGET_CAP_NOTE
    # Limits no shorter than the whole budget left: the report's budget line says it all.
    assert stop_note("wall", own_s=120.0, wall_s=400.0, limit_s=400.0) == ""
    assert stop_note("own", own_s=400.0, wall_s=400.0, limit_s=400.0) == ""
    assert stop_note(None, own_s=120.0, wall_s=77.0, limit_s=400.0) == ""


def test_the_plain_modes_at_the_lead_precision_run_before_other_scopes():
    """An H200 bert-base train tune at bb4a839 (verdict balanced, bf16 allowed) measured default's
    regional and whole-step variants first and had no time left for reduce-overhead+bf16."""
    ev = Evidence(device="cuda", step="train", verdict="balanced", graph_breaks=0,
                  has_repeated_blocks=True, allow_precision={"bf16"})  # fmt: skip
    specs = [c.spec for c in candidates(ev)]
    assert specs[:2] == [
        "inductor:fullgraph=true,dynamic=false+bf16",
        "inductor:mode=reduce-overhead,fullgraph=true,dynamic=false+bf16",
    ]
    assert any("scope=regions" in s for s in specs[2:]) and any("scope=step" in s for s in specs)


def test_refinements_wait_for_the_cheap_modes_at_the_lead_precision():
    ev = Evidence(device="cuda", step="train", verdict="gpu-compute-bound", graph_breaks=0,
                  convolutional=True, allow_precision={"bf16"})  # fmt: skip
    plan = candidates(ev)
    primary = [c.spec for c in plan if c.primary]
    assert primary == [
        "inductor:fullgraph=true,dynamic=false+bf16",
        "inductor:mode=reduce-overhead,fullgraph=true,dynamic=false+bf16",
    ]
    default_bf16 = trial(primary[0], 8.0, (7.9, 8.1), 2.0, (1.9, 2.1), 20, precision="bf16")
    pending = [(2, next(c for c in plan if c.spec == primary[1]))]
    search = {"skipped": {}, "refined": []}
    # reduce-overhead+bf16 still waits: the leader (default+bf16) is not refined yet.
    assert refine([EAGER, default_bf16], EAGER, ev, pending, search, next_index=9) == 9
    assert [c.spec for _, c in pending] == [primary[1]] and not search["refined"]
    pending.clear()
    refine([EAGER, default_bf16], EAGER, ev, pending, search, next_index=9)
    assert [c.spec for _, c in pending] == [primary[0] + "+channels_last"]


def test_the_tie_list_leaves_out_variants_significantly_slower_than_eager_or_the_pick():
    # A wide interval at the top overlaps everything, a variant at 0.60x [0.31, 0.64] included.
    wide = trial("inductor", 8.0, (5.0, 18.0), 1.2, (0.55, 1.9), 20)
    slow = trial("inductor:mode=max-autotune", 16.0, (15.0, 30.0), 0.60, (0.31, 0.64), 90)
    sel = select([EAGER, wide, slow], baseline=EAGER)
    assert sel.best["variant"] == "eager"  # the cheapest of the tie
    assert slow["variant"] not in sel.tied
    assert set(sel.tied) == {"eager", "inductor"}
    assert "tie: 2 variants" in sel.reason
    # Tied with the top but significantly slower than the cheaper pick: no tie either.
    pick = trial("inductor:scope=regions", 5.0, (4.9, 5.1), 2.0, (1.9, 2.1), 5)
    top = trial("inductor:fullgraph=true", 4.0, (2.0, 8.0), 2.5, (1.2, 4.0), 30)
    under = trial("inductor:dynamic=false", 7.0, (6.5, 7.5), 1.4, (1.3, 1.5), 40)
    sel = select([EAGER, top, pick, under], baseline=EAGER)
    assert sel.best["variant"] == pick["variant"]
    assert set(sel.tied) == {top["variant"], pick["variant"]}
    assert "tie: 2 variants" in sel.reason


def test_eager_as_the_pick_is_not_called_faster_than_itself():
    noisy_eager = trial("eager", 10.0, (9.9, 10.1), 1.06, (1.02, 1.2), 0.2)
    failed = trial("inductor", 0, (0, 0), 0, (0, 0), 0, status="timeout")
    sel = select([noisy_eager, failed], baseline=noisy_eager)
    assert sel.best["variant"] == "eager"
    assert "over eager" not in sel.reason
    assert sel.reason == "the only variant that finished and passed the check; 1 did not"
    assert select([noisy_eager], baseline=noisy_eager).reason == "the only variant measured"
    slower = trial("inductor:mode=max-autotune", 20.0, (19.8, 20.2), 0.5, (0.49, 0.51), 30)
    sel = select([noisy_eager, slower], baseline=noisy_eager)
    assert sel.reason.startswith("no compiled variant was faster: 1 other passed, slower")


def test_with_no_graph_break_a_refinement_moves_its_planned_fullgraph_twin_up():
    ev = Evidence(device="cuda", step="infer", allow_precision={"bf16"}, graph_breaks=0)
    lead = "inductor:mode=reduce-overhead,dynamic=false,freezing=true+bf16"
    twin = "inductor:mode=max-autotune,fullgraph=true,dynamic=false,freezing=true+bf16"
    results = [EAGER, trial(lead, 2.5, (2.4, 2.6), 4.0, (3.9, 4.1), 25, precision="bf16")]
    pending = [(5, Candidate("cudagraphs", "later", 6.0, 0.5)), (6, Candidate(twin, "p", 2, 3))]
    search = {"skipped": {}, "refined": []}
    nxt = refine(results, EAGER, ev, pending, search, next_index=7)
    # The autotuned leader is the planned twin's compile: the twin runs, nothing is added.
    assert [(i, c.spec) for i, c in pending] == [(6, twin), (5, "cudagraphs")] and nxt == 7
    assert [r["spec"] for r in search["refined"]] == [twin]
    # Measured, it stands for the refinement: not queued again.
    pending.pop(0)
    results.append(trial(twin, 2.6, (2.5, 2.7), 3.9, (3.8, 4.0), 90, precision="bf16"))
    refine(results, EAGER, ev, pending, search, next_index=nxt)
    assert [c.spec for _, c in pending] == ["cudagraphs"]
    # With a graph break the flag matters (a break becomes an error): they are two candidates.
    broken = Evidence(device="cuda", step="infer", allow_precision={"bf16"}, graph_breaks=2)
    pending = [(6, Candidate(twin, "p", 2, 3))]
    refine(results[:2], EAGER, broken, pending, {"skipped": {}, "refined": []}, next_index=7)
    assert [c.spec for _, c in pending] == [
        "inductor:mode=max-autotune,dynamic=false,freezing=true+bf16",
        twin,
    ]
