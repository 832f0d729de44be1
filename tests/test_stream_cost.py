"""The verdicts on a stream trial's costs: compilation dominating the stream's time, and CUDA
graphs recorded more often than the stream's shapes (or buckets) need. Numbers are fed."""

import math

from torchkiln.diagnose.stream_cost import compile_share, needed_recordings, stream_verdicts


def test_compilation_dominates_above_half_of_the_stream():
    m = {"compile_time_s": 3.0, "total_s": 4.0, "cudagraph_recordings": None}
    assert compile_share(m) == 0.75
    assert stream_verdicts(m) == [
        "compilation dominates this stream: 75% of its time (3.00 s of 4.00 s)"
    ]
    assert stream_verdicts({"compile_time_s": 2.0, "total_s": 4.0}) == []  # half: not over
    assert stream_verdicts({"compile_time_s": None, "total_s": 4.0}) == []  # not timed here


def test_the_compile_verdict_says_when_the_one_off_cost_is_repaid():
    from torchkiln.diagnose.stream_cost import repaid_after

    # 500 items: 84 s in all, 3 ms an item after warm-up against eager's 9.5 ms
    m = {"compile_time_s": 10.0, "warmup_compile_time_s": 69.0, "total_s": 84.0, "items": 500,
         "steady_time_per_item_s": 0.003, "eager_steady_time_per_item_s": 0.0095}  # fmt: skip
    once = 84.0 - 0.003 * 500  # 82.5 s beyond the steady rate
    assert repaid_after(m) == math.ceil(once / 0.0065) == 12693
    assert repaid_after(m, eager_item_s=0.0105) == math.ceil(once / 0.0075)  # another eager
    assert stream_verdicts(m) == [
        "compilation dominates this stream: 94% of its time (79.00 s of 84.00 s): "
        "a one-off cost, repaid against eager after 12693 items"
    ]
    slower = {**m, "steady_time_per_item_s": 0.0095}  # no gain over eager: never repaid
    assert repaid_after(slower) is None
    assert stream_verdicts(slower)[0].endswith(
        ": never repaid, as it is no faster than eager after warm-up"
    )
    assert repaid_after({"total_s": 1.0, "items": 5}) is None  # no steady figures


def test_a_bucketed_warmup_compile_counts_toward_the_share():
    m = {"compile_time_s": 0.0, "warmup_compile_time_s": 6.0, "total_s": 8.0}
    assert compile_share(m) == 0.75
    assert stream_verdicts(m)[0].startswith("compilation dominates this stream: 75%")


def test_cuda_graphs_rerecorded_beyond_the_shapes():
    m = {"cudagraph_recordings": 9, "distinct_shapes": 5, "graphs_per_item": 1}
    assert needed_recordings(m) == 5
    assert stream_verdicts(m) == ["CUDA graphs re-recorded 4 times: 9 recordings for 5 shapes"]
    assert stream_verdicts({**m, "cudagraph_recordings": 5}) == []  # one per shape: expected
    assert stream_verdicts({**m, "cudagraph_recordings": None}) == []  # no CUDA graphs here


def test_graph_breaks_and_buckets_set_the_recordings_needed():
    # two graphs an item (one graph break): ten recordings for five shapes are what it needs
    broken = {"cudagraph_recordings": 10, "distinct_shapes": 5, "graphs_per_item": 2}
    assert stream_verdicts(broken) == []
    assert stream_verdicts({**broken, "cudagraph_recordings": 12}) == [
        "CUDA graphs re-recorded 2 times: 12 recordings for 5 shapes x 2 graphs an item"
    ]
    # a bucketed candidate needs one per bucket, whatever the stream's shapes
    bucketed = {"cudagraph_recordings": 4, "distinct_shapes": 40, "buckets": {"seq": [8, 16, 32]}}
    assert needed_recordings(bucketed) == 3
    assert stream_verdicts(bucketed) == [
        "CUDA graphs re-recorded 1 time: 4 recordings for 3 buckets"
    ]


def test_both_verdicts_reach_the_tune_report_and_the_pick():
    from torchkiln.tune.stream_search import _report_md, _select, _why

    slow = {"variant": "inductor:mode=reduce-overhead", "status": "ok", "reason": "",
            "stream": {"total_s": 2.0, "eager_total_s": 4.0, "compile_time_s": 1.5, "items": 9,
                       "steady_time_per_item_s": 0.05, "eager_steady_time_per_item_s": 0.4,
                       "cudagraph_recordings": 7, "distinct_shapes": 3, "graphs_per_item": 1,
                       "compiles": 3, "recompiles": 2, "eager_fallbacks": 0,
                       "steady_speedup": 3.0, "padding_waste": 0.0}}  # fmt: skip
    slow["stream"]["verdicts"] = stream_verdicts(slow["stream"])
    assert len(slow["stream"]["verdicts"]) == 2
    sel = _select([slow])
    why = _why(slow, sel)
    assert (
        "compilation dominates this stream: 75% of its time (1.50 s of 2.00 s): "
        "a one-off cost, repaid against eager after 5 items"  # 1.55 s over 0.35 s an item
    ) in why
    assert "CUDA graphs re-recorded 4 times: 7 recordings for 3 shapes" in why
    rec = {"code": "run = model", "verdicts": slow["stream"]["verdicts"]}
    doc = {"workload": "w", "device": "cuda", "stream": {"items": 9}, "selection": sel,
           "trials": [slow], "recommendation": rec}  # fmt: skip
    md = _report_md(doc)
    assert "| 75% | 0 | compilation dominates this stream" in md
    assert "The pick: CUDA graphs re-recorded 4 times" in md


def test_unseen_shapes_after_warm_up_dominate_the_steady_state():
    # plain torch.compile on the H200 bert-base stream: 124 new-shape items after warm-up took
    # 6.39 s, the 1,476 seen ones 8.12 s, and dynamo counted no compile after warm-up
    m = {"steady_first_seen_items": 124, "steady_first_seen_s": 6.39,
         "steady_seen_items": 1476, "steady_seen_s": 8.12, "steady_compiles": 0}  # fmt: skip
    assert stream_verdicts(m) == [
        "unseen shapes dominate the steady state: 124 items of shapes new after warm-up took "
        "6.39 s, 44% of the steady seconds (51.5 ms an item against 5.5 ms for shapes seen before; "
        "nothing compiled after warm-up: kernels specialised or autotuned per size)"
    ]
    # recompiles after warm-up are said as the cause
    assert "3 compiles after warm-up)" in stream_verdicts({**m, "steady_compiles": 3})[0]
    # a quarter of the steady seconds or less: no verdict; none without the split, nor with
    # no new shape after warm-up (a bucketed candidate's replay, say)
    assert stream_verdicts({**m, "steady_first_seen_s": 2.7}) == []
    assert stream_verdicts({**m, "steady_first_seen_s": None}) == []
    assert stream_verdicts({**m, "steady_first_seen_items": 0, "steady_first_seen_s": 0.0}) == []


def test_unseen_shapes_are_read_against_eager_on_the_same_items():
    # the same split with eager's seconds on each part: the new shapes took 3.44x eager's
    # seconds on them, the seen ones 0.69x, so 5.11 s of the 6.39 are beyond the seen pace
    m = {"steady_first_seen_items": 124, "steady_first_seen_s": 6.39,
         "steady_seen_items": 1476, "steady_seen_s": 8.12, "steady_compiles": 0,
         "steady_first_seen_eager_s": 1.86, "steady_seen_eager_s": 11.8}  # fmt: skip
    assert stream_verdicts(m) == [
        "unseen shapes dominate the steady state: 124 items of shapes new after warm-up took "
        "6.39 s, 44% of the steady seconds (51.5 ms an item against 5.5 ms for shapes seen before; "
        "3.44x eager's seconds on the same items against 0.69x on seen shapes, 5.11 s beyond that "
        "pace; nothing compiled after warm-up: kernels specialised or autotuned per size)"
    ]
    # new shapes that are merely larger: eager took as long on them, at the seen items' pace
    # (eager against itself on a 20-item stream, 15 of 16 steady items new), no verdict
    big = {"steady_first_seen_items": 15, "steady_first_seen_s": 3.49, "steady_seen_items": 1,
           "steady_seen_s": 0.138, "steady_compiles": 0, "steady_first_seen_eager_s": 3.47,
           "steady_seen_eager_s": 0.139}  # fmt: skip
    assert stream_verdicts(big) == []
    # beyond the pace by a quarter of the steady seconds or less: none
    assert stream_verdicts({**m, "steady_first_seen_eager_s": 6.0}) == []
    # with the split but no seen shape after warm-up there is no pace to read against
    assert stream_verdicts({**m, "steady_seen_items": 0, "steady_seen_s": 0.0,
                            "steady_seen_eager_s": 0.0}) == []  # fmt: skip
