"""`kiln tune --stream`: the search measures each shape candidate (tune.stream_plan) on the
stream, each in its own process, paired per item with eager on the same stream, and picks the
fastest correct one after warm-up (of those it cannot tell apart from the fastest, the cheapest
to warm up: tune.stream_ties), with what the stream cost each in compiles and warm-up beside it.
"""

from __future__ import annotations

import time
from html import escape
from pathlib import Path
from typing import Any

from torchkiln.diagnose.stream_cost import compile_share, repaid_after, stream_verdicts
from torchkiln.errors import KilnUserError
from torchkiln.runner.protocol.trial import TRIAL_SCHEMA
from torchkiln.runner.protocol.worker import write_json
from torchkiln.tune import recommend, stream_ties
from torchkiln.tune.results_header import results_header
from torchkiln.tune.stream_budget import (
    FIRST_TRIAL_SHARE,
    TRIAL_CAP_FACTOR,
    StreamEstimator,
    compile_kind,
    expected_compiles,
    stream_slots,
    trial_cap,
    trial_order,
)
from torchkiln.tune.stream_plan import StreamCandidate, stream_candidates
from torchkiln.tune.time_spent import time_spent

MIN_TRIAL_S = 10.0  # less than this left: the next trial could not finish its compiles


def load_stream(
    workload: str,
    preset: str,
    batch_size: int | None,
    stream: str | None,
    length: int | None,
    step: str | None = None,
) -> Any:
    """The stream, built and checked before anything is written: a bad trace fails with its line
    named and leaves an earlier run's files as they were."""
    return _load(workload, preset, batch_size, stream, length, step)[1]


def _load(
    workload: str,
    preset: str,
    batch_size: int | None,
    stream: str | None,
    length: int | None,
    step: str | None,
) -> tuple[Any, Any]:
    from torchkiln.workloads.loader import load_workload
    from torchkiln.workloads.stream import workload_stream

    if stream is not None and not Path(stream).is_file():
        raise KilnUserError(f"--stream {stream!r}: no such file")
    w = load_workload(workload, preset=preset, batch_size=batch_size, step=step)
    return w, workload_stream(w, stream, length)


def _bucketing_refused(stream: Any, workload: Any = None) -> str | None:
    """Why no bucketed candidate is planned; with ``workload`` (a training stream) its inputs
    must also declare how they pad without changing the loss."""
    from torchkiln.measure.stream_buckets import dynamic_dims
    from torchkiln.measure.stream_train import pad_refusal

    try:
        dims = dynamic_dims(stream)
    except KilnUserError as exc:
        return str(exc)
    return None if workload is None else pad_refusal(workload, dims)


def _as_trial(i: int, r: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """A stream trial as an entry of results.json's `trials`: the common fields, and the
    replay's measurements under `stream`."""
    status = r.get("status", "error")
    reason = r.get("error") or (
        f"items {r['mismatched_items'][:5]} differ from eager" if status == "incorrect" else ""
    )
    metrics = {k: v for k, v in r.items() if k not in ("variant", "status", "error", "progress")}
    return {
        "schema": TRIAL_SCHEMA,
        "id": f"{i:02d}-stream",
        "workload": base["workload"],
        "variant": r["variant"],
        "baseline": "eager",
        "step": base["step"],
        "device": base["device"],
        "status": "ok" if status == "ok" else status,
        "reason": reason,
        "stream": metrics or None,
        # a trial that left no result: where it was when it was stopped (stream_progress)
        **({"progress": r["progress"]} if r.get("progress") else {}),
    }


# how a trial without a result ended, said of one and of several
_ENDED = {
    "incorrect": ("did not match eager", "did not match eager"),
    "timeout": ("ran past its cap", "ran past their caps"),
    "crashed": ("crashed", "crashed"),
    "error": ("failed", "failed"),
}


def _none_ok(trials: list[dict[str, Any]]) -> str:
    """Why no candidate has a result: none was run, or how each ended (a search whose trials all
    ran past their caps measured nothing; it did not find them wrong)."""
    if not trials:
        return "no candidate was measured on the stream"
    ended: dict[str, int] = {}
    for t in trials:
        ended[t["status"]] = ended.get(t["status"], 0) + 1
    parts = []
    for status, n in sorted(ended.items(), key=lambda kv: -kv[1]):
        one, many = _ENDED.get(status, (status, status))
        parts.append(f"{n} {one if n == 1 else many}")
    why = f"no candidate replayed the stream correctly: of {len(trials)}, " + ", ".join(parts)
    if "timeout" in ended:
        why += " (a larger --budget, or a shorter --stream-len, gives each trial more room)"
    return why


def _eager_item_s(ok: list[dict[str, Any]]) -> float:
    """Eager's seconds an item after warm-up: the median of its replays, one paired with each
    candidate that replayed the stream correctly."""
    import statistics

    return statistics.median(t["stream"]["eager_steady_time_per_item_s"] for t in ok)


def _select(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest correct candidate after warm-up, eager among them, by its seconds per item over
    the stream's steady part (the items after its first 20%, compiles there included); eager's
    is the median of its paired replays (one per trial, each on the same stream). A server pays
    its compiles and a bucketed warm-up once per process (and `kiln ship` spares them), so they
    are reported, with the items it takes to repay them against eager (`break_even_steps`) and
    each candidate's whole-stream seconds (`total_s`), and do not decide the pick."""
    import statistics

    ok = [t for t in trials if t["status"] == "ok"]
    rejected = {t["variant"]: f"{t['status']}: {t['reason']}" for t in trials if t not in ok}
    if not ok:
        return {
            "best": None,
            "reason": _none_ok(trials),
            "tied": [],
            "steady_vs_fastest": {},
            "ranking": [],
            "break_even_steps": {},
            "rejected": rejected,
            "best_numerics_changing": None,
        }
    eager_item = _eager_item_s(ok)
    steady = {t["variant"]: t["stream"]["steady_time_per_item_s"] for t in ok}
    steady["eager"] = eager_item
    totals = {t["variant"]: t["stream"]["total_s"] for t in ok}
    totals["eager"] = statistics.median(t["stream"]["eager_total_s"] for t in ok)
    ranking = sorted(steady, key=steady.get)
    best = ranking[0]
    ties: dict[str, Any] = {"tied": [], "vs_fastest": {}, "reason": None}
    if best != "eager":
        ties = stream_ties.settle(ranking, {t["variant"]: t["stream"] for t in ok})
        best = ties["best"]
    # the one-off seconds (compiles, warm-up) over what the stream would take at the steady
    # rate, repaid by the steady gain over eager on each item
    break_even = {t["variant"]: repaid_after(t["stream"], eager_item) for t in ok}
    if best == "eager":
        reason = (
            f"no candidate was faster than eager after warm-up ({eager_item * 1e3:.3f} ms an "
            f"item); the fastest, {ranking[1]}, took {steady[ranking[1]] * 1e3:.3f} ms"
        )
    else:
        head = ties["reason"] or "the fastest correct candidate after warm-up"
        reason = (
            f"{head}: {steady[best] * 1e3:.3f} ms an item "
            f"against eager's {eager_item * 1e3:.3f} ms ({eager_item / steady[best]:.2f}x); "
            f"over the whole stream, compiles and warm-up included, {totals[best]:.3f} s "
            f"against eager's {totals['eager']:.3f} s"
        )
        if break_even.get(best):
            reason += f", repaid after {break_even[best]} items"
    return {
        "best": best,
        "reason": reason,
        "tied": ties["tied"],
        "steady_vs_fastest": ties["vs_fastest"],
        "ranking": ranking,
        "break_even_steps": break_even,
        "rejected": rejected,
        "best_numerics_changing": None,
        "steady_s_per_item": steady,
        "total_s": totals,
    }


def _search(
    order: list[StreamCandidate],
    compiles: dict[str, int],
    base: dict[str, Any],
    left: Any,
    events: Any,
    slots: list[int | None],
) -> tuple[list[dict[str, Any]], dict[str, str], StreamEstimator]:
    """Run the candidates in ``order`` within the budget, several at once with several
    ``slots`` (runner.launch.executors.stream: their phases take turns on the host, the
    steady items of one replay at a time). Until a trial has ended and taught the estimate, each
    slot starts the next candidate with a share of what is left; after that a candidate starts
    only when its estimate fits what is left, capped at a multiple of it (stream_budget). The
    results in the order the trials started, what was skipped and why, and the estimate."""
    from torchkiln import cli_stream
    from torchkiln.runner.launch.executors import stream

    queue = list(order)
    skipped: dict[str, str] = {}
    estimate = StreamEstimator()
    done: list[tuple[int, dict[str, Any]]] = []
    running: set[str] = set()
    started = [0]

    def skip(c: StreamCandidate, why: str) -> None:
        skipped[c.name] = why
        if events is not None:
            events.skipped(c.name, why)

    def next_trial() -> tuple[Any, dict[str, Any]] | None:
        while queue:
            c = queue.pop(0)
            room = left()
            if room < MIN_TRIAL_S:
                skip(c, f"the budget is spent ({max(0.0, room):.0f} s left)")
                continue
            need = estimate(compiles[c.name], compile_kind(c))
            if need is not None and need > room:
                n = compiles[c.name]
                skip(c, f"would not fit the budget (estimated {need:.0f} s for {n} "
                        f"compile{'s' * (n != 1)}, {room:.0f} s left)")  # fmt: skip
                continue
            if events is not None:
                events.stage("search", f"{c.name} on the stream", room)
            cap = trial_cap(need, room, last=not queue and not running)
            running.add(c.name)
            tag = (started[0], c, need, cap, room)
            started[0] += 1
            return tag, {**base, "variant": c.name, "_limits": (room, cap)}
        return None

    def run_one(spec: dict[str, Any], gpu: int | None, host_lock: str | None = None) -> dict:
        room, cap = spec.pop("_limits")
        try:
            return cli_stream.run_stream_trial(spec, room, own_cap_s=cap, host_lock=host_lock)
        except Exception as exc:  # noqa: BLE001  (every failure becomes a reported status)
            why = f"the search could not run the trial: {type(exc).__name__}: {exc}"
            return {"variant": spec["variant"], "status": "error", "error": why}

    def on_done(tag: Any, r: dict[str, Any]) -> None:
        k, c, need, cap, room = tag
        running.discard(c.name)
        r["expected_compiles"] = compiles[c.name]
        r["estimate_s"] = need
        if r.get("status") == "timeout" and cap < room and "its cap of" in r.get("error", ""):
            r["error"] += (
                f" ({TRIAL_CAP_FACTOR:g}x its estimate of {need:.0f} s)"
                if need is not None
                else f" (before any estimate: {FIRST_TRIAL_SHARE:.0%} of the {room:.0f} s left)"
            )
        estimate.learn(c.name, compiles[c.name], r, compile_kind(c))
        done.append((k, r))

    stream(slots, next_trial, run_one, on_done)
    return [r for _, r in sorted(done, key=lambda d: d[0])], skipped, estimate


def tune_stream(
    workload: str,
    *,
    device: str,
    preset: str,
    batch_size: int | None,
    budget_s: float,
    allow_precision: set[str],
    out: Path,
    stream: str | None,
    stream_len: int | None,
    step: str = "infer",
    events: Any = None,
) -> dict[str, Any]:
    """Measure the shape candidates on the stream within the budget; write results.json and
    report.md and report.html into ``out``."""
    t0 = time.monotonic()
    left = lambda: budget_s - (time.monotonic() - t0)  # noqa: E731
    w, items = _load(workload, preset, batch_size, stream, stream_len, step)
    no_buckets = _bucketing_refused(items, w if step == "train" else None)
    plan: list[StreamCandidate] = stream_candidates(
        device,
        allow_precision,
        can_bucket=no_buckets is None,
        can_mark=no_buckets is None and step == "infer",  # a training trial marks no dims
    )
    base = {
        "workload": workload,
        "step": step,
        "preset": preset,
        "batch_size": batch_size,
        "device": device,
        "stream": str(Path(stream).resolve()) if stream else None,
        "stream_len": stream_len,
    }
    # Compiles expected of each candidate, and the estimates learned from each trial run
    # (stream_budget): a candidate starts only when its estimate fits what is left.
    compiles = {c.name: expected_compiles(c, items) for c in plan}
    order = trial_order(plan, compiles)
    slots, in_flight = stream_slots(device)
    raw, skipped, estimate = _search(order, compiles, base, left, events, slots)
    errors = {r.get("error") for r in raw if r.get("status") == "error"}
    if raw and len(errors) == 1 and all(r.get("status") == "error" for r in raw):
        # the same refusal in every trial is the stream's fault, not a candidate's
        raise KilnUserError(errors.pop())
    trials = [_as_trial(i + 1, r, base) for i, r in enumerate(raw)]
    for t in trials:
        s = t["stream"]
        if s and "eager_time_per_item_s" in s:
            s["eager_total_s"] = s["eager_time_per_item_s"] * s["items"]
    ok = [t for t in trials if t["status"] == "ok"]
    eager_item = _eager_item_s(ok) if ok else None
    for t in trials:
        if t["stream"]:
            t["stream"]["verdicts"] = stream_verdicts(t["stream"], eager_item)
    selection = _select(trials)
    best = next((t for t in trials if t["variant"] == selection["best"]), None)
    if selection["best"] == "eager":
        best = {"variant": "eager", "stream": {}}
    doc: dict[str, Any] = {
        **results_header(
            workload=workload,
            step=step,
            device=device,
            preset=preset,
            batch_size=batch_size,
            budget_s=budget_s,
            steps=None,
            allow_precision=allow_precision,
        ),
        "stream": {**base, "items": len(items)},
        "stages": {
            "environment": {"status": "skipped", "reason": "a stream tune"},
            "profile": {"status": "skipped", "reason": "a stream tune times the stream itself"},
            "graph_breaks": {"status": "skipped", "reason": "a stream tune", "breaks": None},
            "search": {
                "evidence": {"stream_items": len(items), "bucketing_refused": no_buckets},
                "planned": [c.name for c in plan],
                "order": [c.name for c in order],
                "in_flight": {"trials": len(slots), "why": in_flight},
                "expected_compiles": compiles,
                "estimate": estimate.__dict__,
                "skipped": skipped,
            },
        },
        "selection": selection,
        "recommendation": None
        if best is None
        else {
            "variant": best["variant"],
            "code": _code(best["variant"], best["stream"], device, step),
            "why": _why(best, selection),
            "verdicts": (best["stream"] or {}).get("verdicts", []),
        },
        "trials": trials,
        "head_to_head_trials": [],
    }
    doc["wall_s"] = time.monotonic() - t0
    doc["time_spent"] = time_spent(doc, {"search": doc["wall_s"]})
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", doc)
    write_stream_reports(doc, out)
    return doc


def _code(name: str, metrics: dict[str, Any], device: str, step: str) -> str:
    if step == "train":
        from torchkiln.tune.stream_train_code import train_stream_code

        return train_stream_code(name, metrics, device)
    return recommend.stream_code(name, metrics, device)


def write_stream_reports(doc: dict[str, Any], out: str | Path) -> None:
    """report.md and report.html (the same text) of a tune on a stream."""
    md = _report_md(doc)
    (Path(out) / "report.md").write_text(md)
    page = f"<!doctype html><meta charset=utf-8><pre>{escape(md)}</pre>\n"
    (Path(out) / "report.html").write_text(page)


def _why(best: dict[str, Any], selection: dict[str, Any]) -> list[str]:
    """The pick's reason, then what the stream cost it in compiles (from dynamo's counters)."""
    why = [selection["reason"]]
    s = best.get("stream") or {}
    if s.get("buckets"):
        why.append(
            f"{s.get('warmup_compiles')} graphs compiled in warm-up for buckets {s['buckets']}, "
            f"{s.get('compiles')} during the stream, {s.get('eager_fallbacks')} items run eagerly"
        )
    elif s:
        why.append(
            f"{s.get('compiles')} graphs compiled over the stream's {s.get('distinct_shapes')} "
            f"shapes ({s.get('recompiles')} recompiles), {s.get('eager_fallbacks')} eager "
            f"fallbacks; after warm-up {s.get('steady_speedup', 0):.2f}x eager"
        )
    return why + (s["verdicts"] if "verdicts" in s else stream_verdicts(s))


STEADY_KEYS = ("steady_time_per_item_s", "eager_steady_time_per_item_s")


def _num(x: Any) -> str:
    return "" if x is None else f"{x:.4g}"


def _report_md(doc: dict[str, Any]) -> str:
    lines = [
        f"# kiln tune on a stream: {doc['workload']} ({doc['device']})",
        "",
        f"{doc['stream']['items']} items. Pick: {doc['selection']['best'] or 'eager'}: "
        f"{doc['selection']['reason']}.",
        "",
        "| candidate | status | steady ms/item | eager steady ms/item | steady x | total s "
        "| eager total s | compiles | recompiles | compile share | padding waste "
        "| verdict, or why it has no result |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in doc["trials"]:
        s = t["stream"] or {}
        share = compile_share(s)
        ms = {k: None if s.get(k) is None else s[k] * 1e3 for k in STEADY_KEYS}
        lines.append(
            f"| `{t['variant']}` | {t['status']} | {_num(ms[STEADY_KEYS[0]])} | "
            f"{_num(ms[STEADY_KEYS[1]])} | {_num(s.get('steady_speedup'))} | "
            f"{_num(s.get('total_s'))} | {_num(s.get('eager_total_s'))} | "
            f"{s.get('compiles', '')} | {s.get('recompiles', '')} | "
            f"{'' if share is None else f'{share:.0%}'} | {_num(s.get('padding_waste'))} | "
            f"{'; '.join(s.get('verdicts') or []) or (t.get('reason') or '')} |"
        )
    rec = doc["recommendation"]
    if rec:
        for v in rec.get("verdicts") or []:
            lines += ["", f"The pick: {v}."]
        lines += ["", "```python", rec["code"], "```"]
    return "\n".join(lines) + "\n"
