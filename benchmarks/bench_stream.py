"""GPU evidence for `kiln tune --stream`: the stream tune's pick against the best plain
`torch.compile` mode, both replayed on the same stream in the same run.

    PYTHONPATH=src python3 benchmarks/bench_stream.py --out benchmarks/results/stream/h200 \\
        --only tune:bert-base:infer --budget 8m30s

Workloads and steps (--pairs): bert-base inference and training, GPT-2 inference, each on N items
(--stream-len, default 2000) of the workload's default stream (bert-base and gpt2: log-normal
sequence lengths, median 64, tail to the model's positions; docs/streams.md), bf16 allowed.
A GPU call is limited to 10 minutes, so the work comes in parts, each one command:

- `tune:W:STEP`: `kiln tune W --step STEP --stream-len T --budget B` (OUT/W-STEP/results.json)
  on the stream's first T items (--tune-stream-len, default 500 for inference and 200 for
  training: each trial replays them through eager and the candidate, and a tune of 8m30s
  measured half of bert-base's 24 inference candidates on an H200 at 500);
  B must leave the call room for the tune's setup (8m30s in a 10-minute call). The tune's budget
  check stops it starting a candidate with too little left, so it ends within B and a few
  seconds; the candidates it had no room for are named (stages.search.skipped).
- `plain:W:STEP`: the pick read from that tune's results.json, then the pick AND each plain mode
  (--plain-modes: default, reduce-overhead, max-autotune-no-cudagraphs, max-autotune, `dynamic`
  left at its default, at the pick's precision; for an eager or fp32 pick also at each allowed
  16-bit precision) replayed on the same stream (the tune's preset, --stream-len items), each a
  stream trial in its own process paired item by item with eager (runner.protocol.stream_trial).
  The pick is replayed again here, not taken from the tune, so it and the plain modes are measured
  in one run. Each trial's result is written as it finishes (OUT/W-STEP-plain/<variant>.json): a
  killed call keeps what finished, and a rerun of the same command measures only what is missing
  (with --again-pick, the pick too, so that it and the rest are still measured in one call).
  Each replay starts with empty Inductor and Triton caches, so its compiles cost what a first
  run's do. On a GPU several are in flight at once, as the tune's trials are (tune.stream_budget:
  each replay's steady items alone on the host; --trial-timeout then caps a trial's own seconds,
  its waits for a turn not counted). No trial is started with less than --min-trial of
  --part-budget left; a trial cut short by the part's budget (not by --trial-timeout) leaves no
  file, so the rerun measures it. The max-autotune replays start last, once nothing else is in
  flight: their first items, slow on each new size, hold a compile turn that the others' steady
  items would wait out (`start_order`).
- `--summarize`: runs nothing; combines the parts present into OUT/bench_stream.json (the
  environment, every command, every trial) with the goals judged, and prints the table: the
  pick, the best plain mode, their ratio of steady-state seconds per item (after the first 20% of
  items) and of whole-stream seconds (compiles and a bucketed pick's warm-up included), the
  pick's recompiles after warm-up, the tune's wall time.

Goals: the pick's steady seconds per item (the tune's basis for its pick) at least 2x better than
the best plain mode's on the inference streams and at least 1.3x on the training stream; the
pick compiles nothing after warm-up (its `steady_compiles` 0 and, for a bucketed pick,
`recompiles_after_warmup` 0); the tune within 15 minutes. Without --only every part runs in
order and the summary is written. The CPU check of
the script itself: --pairs simple:infer,simple:train --device cpu --preset tiny --stream-len 30
--budget 90s --part-budget 60m (bert-base compiles for minutes a candidate on two cores).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_tune import PLAIN_MODES, plain_specs  # noqa: E402
from torchkiln.errors import KilnUserError  # noqa: E402
from torchkiln.tune.api import parse_budget  # noqa: E402
from torchkiln.tune.stream_plan import parse_stream_candidate  # noqa: E402
from torchkiln.variants import parse_variant  # noqa: E402

PAIRS = ("bert-base:infer", "bert-base:train", "gpt2:infer")
# the CPU check of the script itself: a 2-core machine compiles bert-base for minutes a candidate
CHECK_PAIRS = ("simple:infer", "simple:train")
GOAL_OVER_PLAIN = {"infer": 2.0, "train": 1.3}
GOAL_TUNE_S = 15 * 60.0
# Items a stream tune replays per candidate. A bert-base training item (batch 16) replayed with
# its eager pair took about 0.13 s on an H100, against milliseconds for inference: at 500 items
# a training candidate's replay alone took over a minute of the host, two thirds of the budget
# for 16 candidates.
TUNE_STREAM_LEN = {"infer": 500, "train": 200}
SCHEMA = "kiln.bench_stream/1"
# the fields of a stream trial the summary keeps (the trial files keep everything)
KEPT = (
    "status",
    "error",
    "items",
    "distinct_shapes",
    "total_s",
    "time_per_item_s",
    "steady_time_per_item_s",
    "p50_s",
    "p99_s",
    "steady_speedup_median_paired",
    "speedup",
    "steady_speedup",
    "eager_time_per_item_s",
    "eager_steady_time_per_item_s",
    "compiles",
    "recompiles",
    "steady_compiles",
    "steady_compile_time_s",
    "recompiles_after_warmup",
    "cudagraph_recordings",
    "steady_cudagraph_recordings",
    "steady_first_seen_items",
    "steady_first_seen_s",
    "steady_seen_items",
    "steady_seen_s",
    "compile_time_s",
    "warmup_s",
    "padding_waste",
    "eager_fallbacks",
    "verdicts",
)


def tune_dir(out: Path, workload: str, step: str) -> Path:
    return out / f"{workload}-{step}"


def plain_dir(out: Path, workload: str, step: str) -> Path:
    return out / f"{workload}-{step}-plain"


def trial_file(d: Path, variant: str) -> Path:
    # letters, digits, dots and dashes only: a name any copy of the results keeps as it is
    return d / (re.sub(r"[^A-Za-z0-9.-]+", "_", variant) + ".json")


def parse_part(text: str) -> tuple[str, str, str]:
    kind, _, pair = text.partition(":")
    if kind not in ("tune", "plain") or pair not in PAIRS + CHECK_PAIRS:
        choices = [f"{k}:{p}" for p in PAIRS + CHECK_PAIRS for k in ("tune", "plain")]
        raise argparse.ArgumentTypeError(f"--only {text!r}; choose from {', '.join(choices)}")
    workload, step = pair.split(":")
    return kind, workload, step


def plain_variants(pick: str, modes: tuple[str, ...], allowed: tuple[str, ...]) -> list[str]:
    """The plain modes the pick faces: at its precision, and for an eager or fp32 pick also at
    each allowed 16-bit precision (the bar a 16-bit plain compile sets)."""
    precision = parse_variant(parse_stream_candidate(pick).variant).precision
    precisions = [precision]
    if pick == "eager" or precision == "fp32":
        precisions += [p for p in allowed if p in ("bf16", "fp16") and p != precision]
    return [v for p in precisions for v in plain_specs(p, modes)]


def replayed_variants(pick: str, modes: tuple[str, ...], allowed: tuple[str, ...]) -> list[str]:
    """The pick first, then the plain modes; a plain mode that is the pick is the pick's trial."""
    return list(dict.fromkeys([pick, *plain_variants(pick, modes, allowed)]))


def start_order(variants: list[str]) -> list[str]:
    """The order the replays start in: max-autotune's last, once no other replay is in flight
    (`run_plain`). A max-autotune replay's first items hold a compile turn that the other
    replays' steady items wait out: on an H100 (bert-base training, 2,000 items, bf16) both
    max-autotune modes compiled 3 graphs in about 230 s and were at item 212 when their 480 s ran
    out (about 0.8 s an item on the stream's first sizes), while the pick and `default`, started
    beside them, waited for their steady turn until the part's 9 minutes ended, and nothing was
    measured."""
    return sorted(variants, key=_autotunes)


def _autotunes(variant: str) -> bool:
    return "max-autotune" in variant


def environment(device: str) -> dict[str, Any]:
    """This machine's environment, collected in a child process: the benchmark's own process
    holds no device context while the trials it starts measure."""
    code = (
        "import json,sys; from torchkiln.measure.environment import collect; "
        "print(json.dumps(collect(sys.argv[1]), default=str))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, device], capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"environment not collected (exit {proc.returncode}): {tail}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Written whole or not at all: a call killed mid-write leaves no half file to trust."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str))
    tmp.replace(path)


def run_tune(args: argparse.Namespace, workload: str, step: str, out: Path, command: str) -> None:
    from torchkiln.tune import tune

    d = tune_dir(out, workload, step)
    if (d / "results.json").exists() and not args.redo:
        print(f"== tune {workload} {step}: kept {d / 'results.json'} (--redo to tune again)")
        return
    n = min(args.tune_stream_len or TUNE_STREAM_LEN[step], args.stream_len)
    print(f"== tune {workload} {step} on {n} items (budget {args.budget})", flush=True)
    part: dict[str, Any] = {"command": command, "budget_s": parse_budget(args.budget)}
    t0 = time.monotonic()
    try:
        doc = tune(
            workload,
            step=step,
            device=args.device,
            budget=args.budget,
            allow_precision=[p for p in args.allow_precision.split(",") if p],
            preset=args.preset,
            out=d,
            history=False,
            stream_len=n,
        ).doc
        part["pick"] = (doc.get("selection") or {}).get("best")
        print(f"   pick {part['pick']} in {doc.get('wall_s', 0):.0f} s", flush=True)
    except KilnUserError as exc:  # the tune refused the stream: the part says why
        part["error"] = str(exc).splitlines()[0]
        print(f"   {workload} {step}: {part['error']}", flush=True)
    part["call_wall_s"] = time.monotonic() - t0
    write_json(d / "bench_part.json", part)


def run_plain(
    args: argparse.Namespace, workload: str, step: str, out: Path, command: str, t0: float
) -> None:
    from torchkiln.cli_stream import run_stream_trial
    from torchkiln.runner.launch.executors import stream
    from torchkiln.tune.stream_budget import stream_slots

    results = tune_dir(out, workload, step) / "results.json"
    if not results.exists():
        print(
            f"== plain {workload} {step}: no tune in {results.parent}; run tune:{workload}:{step}"
        )
        return
    doc = json.loads(results.read_text())
    pick = (doc.get("selection") or {}).get("best")
    if not pick:
        print(f"== plain {workload} {step}: the tune picked nothing ({doc['selection']['reason']})")
        return
    modes = tuple(m for m in args.plain_modes.split(",") if m)
    allowed = tuple(p for p in args.allow_precision.split(",") if p)
    d = plain_dir(out, workload, step)
    todo = [v for v in replayed_variants(pick, modes, allowed) if not trial_file(d, v).exists()]
    if getattr(args, "again_pick", False) and todo and pick not in todo:
        # so that the pick and the plain modes still to replay are measured by one command
        # (`pick_and_best_plain_one_call`); its kept replay stays until this one is written
        todo.insert(0, pick)
    print(f"== plain {workload} {step}: the pick {pick}; to replay: {', '.join(todo) or 'none'}")
    if not todo:
        # a measured replay is kept: a rerun replays what is missing, never one measured before
        print(f"   every replay asked for is in {d}; to replay one again, remove its file there")
    # the tune's stream (its preset, batch and trace) at --stream-len items: the tune's own
    # stream, or with --tune-stream-len the whole of which the tune saw the first part
    base = {k: doc["stream"][k] for k in ("workload", "step", "preset", "batch_size", "device")}
    base |= {"stream": doc["stream"]["stream"], "stream_len": args.stream_len}
    budget = parse_budget(args.part_budget)
    invocation = f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} pid {os.getpid()}"
    env = environment(args.device) if todo else None
    # as the tune runs its trials: several in flight on a GPU, steady items alone on the host
    slots, why = stream_slots(args.device)
    print(f"   {why}", flush=True)
    queue = start_order(todo)
    running: set[str] = set()

    def next_trial() -> tuple[Any, dict[str, Any]] | None:
        while queue:
            if _autotunes(queue[0]) and any(not _autotunes(r) for r in running):
                return None  # asked again as each replay ends
            v = queue.pop(0)
            left = budget - (time.monotonic() - t0)
            if left < args.min_trial:
                print(f"   not started: {v} ({left:.0f} s of --part-budget left); rerun for it")
                continue
            print(f"   {v} (up to {min(args.trial_timeout, left):.0f} s)", flush=True)
            running.add(v)
            return v, {**base, "variant": v, "_left": left}
        return None

    def run_one(spec: dict[str, Any], gpu: int | None, host_lock: str | None = None) -> dict:
        left = spec.pop("_left")
        if host_lock is None:  # one at a time: its wall is its own time
            r = run_stream_trial(spec, min(args.trial_timeout, left))
            by_part = left < args.trial_timeout
        else:
            # in flight with others: --trial-timeout caps its own seconds (its waits for a turn
            # on the host not counted), the part's budget its wall
            r = run_stream_trial(spec, left, own_cap_s=args.trial_timeout, host_lock=host_lock)
            by_part = "past its cap" not in (r.get("error") or "")
        r["_by_part"] = r.get("status") == "timeout" and by_part
        return r

    def on_done(v: str, r: dict[str, Any]) -> None:
        running.discard(v)
        if r.pop("_by_part"):
            print(f"   {v}: stopped by --part-budget, not by its own limit; rerun to measure it")
            return
        role = "pick" if v == pick else "plain"
        write_json(
            trial_file(d, v),
            {**r, "role": role, "command": command, "invocation": invocation, "environment": env},
        )
        print(f"   {v}: {r.get('status')} {_total(r)}", flush=True)

    stream(slots, next_trial, run_one, on_done)


def _total(r: dict[str, Any]) -> str:
    return "" if r.get("total_s") is None else f"{r['total_s']:.2f} s over the stream"


def _kept(r: dict[str, Any]) -> dict[str, Any]:
    return {k: r.get(k) for k in KEPT if k in r}


def _measured(r: dict[str, Any] | None) -> bool:
    # an `incorrect` plain mode still counts: it is the bar the pick must clear, and one more
    # competitor makes the comparison stricter, never easier
    return bool(r) and r.get("status") in ("ok", "incorrect") and r.get("total_s") is not None


def _stopped_bound(r: dict[str, Any]) -> dict[str, Any] | None:
    """What a plain replay stopped at its cap shows of its whole-stream seconds: its compiles
    before the stop are part of them, so they bound it from below (its steady seconds per item,
    by which the goal is judged, it does not show)."""
    p = r.get("progress") or {}
    if r.get("status") != "timeout" or p.get("compile_time_s") is None:
        return None
    return {
        "items_done": p.get("items_done"),
        "items": p.get("items"),
        "compiles": p.get("compiles"),
        "total_s_at_least": float(p["compile_time_s"]),
    }


def summarize_pair(args: argparse.Namespace, workload: str, step: str, out: Path) -> dict[str, Any]:
    row: dict[str, Any] = {"workload": workload, "step": step}
    td = tune_dir(out, workload, step)
    part = (
        json.loads((td / "bench_part.json").read_text())
        if (td / "bench_part.json").exists()
        else {}
    )
    row["commands"] = [part["command"]] if part.get("command") else []
    if not (td / "results.json").exists():
        row["missing"] = part.get("error") or f"no tune: run --only tune:{workload}:{step}"
        return row
    doc = json.loads((td / "results.json").read_text())
    pick = (doc.get("selection") or {}).get("best")
    wall = doc.get("wall_s")
    search = doc["stages"].get("search", {})
    row["environment"] = doc.get("environment")
    row["tune_stream_items"] = doc["stream"]["items"]
    row["tune"] = {
        "pick": pick,
        "reason": doc["selection"].get("reason"),
        "wall_s": wall,
        "budget_s": doc.get("budget_s", part.get("budget_s")),
        "planned": search.get("planned"),
        "skipped": search.get("skipped"),
        "from": str(td / "results.json"),
    }
    if not pick:
        row["missing"] = "the tune picked nothing"
        return row
    modes = tuple(m for m in args.plain_modes.split(",") if m)
    allowed = tuple(p for p in args.allow_precision.split(",") if p)
    d = plain_dir(out, workload, step)
    trials: dict[str, dict[str, Any]] = {}
    for v in replayed_variants(pick, modes, allowed):
        f = trial_file(d, v)
        if f.exists():
            trials[v] = json.loads(f.read_text())
    for t in trials.values():
        if t.get("command") and t["command"] not in row["commands"]:
            row["commands"].append(t["command"])
    row["invocations"] = sorted({t.get("invocation") for t in trials.values()} - {None})
    pick_r = trials.get(pick)
    row["pick"] = {"variant": pick, **_kept(pick_r)} if pick_r else None
    row["stream_items"] = (pick_r or {}).get("items")
    wanted = plain_variants(pick, modes, allowed)
    plain = {v: trials[v] for v in wanted if v in trials}
    row["plain"] = {v: _kept(t) for v, t in plain.items()}
    row["plain_not_measured"] = {
        v: f"{trials[v].get('status')}: {trials[v].get('error')}"
        if v in trials
        else f"no result: run --only plain:{workload}:{step}"
        for v in wanted
        if not _measured(trials.get(v))
    }
    row["plain_stopped"] = {
        v: bound for v, t in plain.items() if (bound := _stopped_bound(t)) is not None
    }
    ok = {v: t for v, t in plain.items() if _measured(t)}
    if not _measured(pick_r) or not ok:
        row["missing"] = (
            f"the pick's replay: {'no result' if not pick_r else pick_r.get('status')}"
            if not _measured(pick_r)
            else "no plain mode replayed"
        )
        row["goals"] = judge_row(row, step, None, None, pick_r)
        judge_stopped(row, step, pick_r)
        return row
    best_total = min(ok, key=lambda v: ok[v]["total_s"])
    best_steady = min(ok, key=lambda v: ok[v]["steady_time_per_item_s"])
    row["best_plain_total"] = best_total
    row["best_plain_steady"] = best_steady
    row["over_best_plain_total"] = ok[best_total]["total_s"] / pick_r["total_s"]
    row["over_best_plain_steady"] = (
        ok[best_steady]["steady_time_per_item_s"] / pick_r["steady_time_per_item_s"]
    )
    # the same ratio through each trial's own eager replay (pick speedup over plain speedup):
    # a drift of the machine between two trials' processes cancels out of it
    if pick_r.get("speedup") and ok[best_total].get("speedup"):
        row["over_best_plain_total_via_eager"] = pick_r["speedup"] / ok[best_total]["speedup"]
    # "in the same run": whether the pick and the best plain mode were replayed by one command
    row["pick_and_best_plain_one_call"] = pick_r.get("invocation") == ok[best_total].get(
        "invocation"
    )
    # judged as the tune picks: by the seconds per item after warm-up (tune.stream_search)
    row["goals"] = judge_row(row, step, row["over_best_plain_steady"], wall, pick_r)
    judge_stopped(row, step, pick_r)
    return row


def judge_stopped(row: dict[str, Any], step: str, pick_r: dict[str, Any] | None) -> None:
    """Plain modes stopped at their cap, against the measured pick: their whole-stream seconds
    over the pick's, from below, and whether each such bound alone clears the goal (set only
    when every plain mode not measured was stopped so)."""
    if not _measured(pick_r) or not row["plain_stopped"]:
        return
    for bound in row["plain_stopped"].values():
        bound["over_pick_total_at_least"] = bound["total_s_at_least"] / pick_r["total_s"]
    if len(row["plain_stopped"]) == len(row["plain_not_measured"]):
        row["goals"]["stopped_plain_modes_slower_over_the_stream"] = all(
            b["over_pick_total_at_least"] >= GOAL_OVER_PLAIN[step]
            for b in row["plain_stopped"].values()
        )


def judge_row(
    row: dict[str, Any], step: str, ratio: float | None, wall: float | None, pick_r: dict | None
) -> dict[str, Any]:
    goal = GOAL_OVER_PLAIN[step]
    after = None
    if _measured(pick_r):
        # nothing compiled after warm-up: dynamo's graphs during the steady items, and for a
        # bucketed pick the compiles its buckets refused (BucketedModule) or ran (training)
        counts = [pick_r.get("steady_compiles"), pick_r.get("recompiles_after_warmup")]
        known = [c for c in counts if c is not None]
        after = sum(known) if known else None
    tune_wall = (row.get("tune") or {}).get("wall_s") if wall is None else wall
    return {
        f"over_best_plain_{goal}x": None if ratio is None else ratio >= goal,
        "all_plain_modes_measured": not row.get("plain_not_measured"),
        "recompiles_after_warmup": after,
        "no_recompile_after_warmup": None if after is None else after == 0,
        "tune_within_15m": None if tune_wall is None else tune_wall <= GOAL_TUNE_S,
    }


def summarize(args: argparse.Namespace, out: Path, pairs: list[str], command: str) -> int:
    rows = [summarize_pair(args, *p.split(":"), out) for p in pairs]
    env = next((r["environment"] for r in rows if r.get("environment")), None)
    commands = [c for r in rows for c in r.get("commands", [])] + [command]
    doc = {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": command,
        "commands": list(dict.fromkeys(commands)),
        "environment": env,
        "goals": {p: GOAL_OVER_PLAIN[p.split(":")[1]] for p in pairs} | {"tune_s": GOAL_TUNE_S},
        "rows": rows,
    }
    write_json(out / "bench_stream.json", doc)
    print_table(rows)
    print(f"results: {out / 'bench_stream.json'}")
    return 0


def _ms(r: dict[str, Any] | None, key: str) -> str:
    return "-" if not r or r.get(key) is None else f"{r[key] * 1e3:.2f}"


def print_table(rows: list[dict[str, Any]]) -> None:
    print()
    head = f"{'workload':<10} {'step':<5} {'pick':<44} {'best plain (total)':<36}"
    print(f"{head} {'x total':>8} {'x steady':>8} {'recomp':>6} {'tune s':>7}  goals")
    for r in rows:
        tune = r.get("tune") or {}
        g = r.get("goals") or {}
        line = f"{r['workload']:<10} {r['step']:<5} {tune.get('pick') or '-'!s:<44}"
        line += f" {r.get('best_plain_total') or '-':<36}"
        tot, st = r.get("over_best_plain_total"), r.get("over_best_plain_steady")
        line += (
            f" {'-' if tot is None else f'{tot:.2f}x':>8} {'-' if st is None else f'{st:.2f}x':>8}"
        )
        after = g.get("recompiles_after_warmup")
        wall = tune.get("wall_s")
        line += (
            f" {'-' if after is None else after!s:>6} {'-' if wall is None else f'{wall:.0f}':>7}"
        )
        verdicts = [k for k, v in g.items() if isinstance(v, bool)]
        line += "  " + ", ".join(f"{k}={g[k]}" for k in verdicts)
        print(line)
        if r.get("missing"):
            print(f"{'':<16} missing: {r['missing']}")
        p = r.get("pick") or {}
        b = (r.get("plain") or {}).get(r.get("best_plain_steady") or "") or {}
        if p.get("total_s") is not None:
            print(
                f"{'':<16} pick: {p['total_s']:.2f} s total, steady "
                f"{_ms(p, 'steady_time_per_item_s')} ms/item (p50 {_ms(p, 'p50_s')}, p99 "
                f"{_ms(p, 'p99_s')}); after warm-up, new shapes: "
                f"{p.get('steady_first_seen_items')} items {p.get('steady_first_seen_s', 0):.2f} s,"
                f" seen shapes: {p.get('steady_seen_items')} items "
                f"{p.get('steady_seen_s', 0):.2f} s, compiles {p.get('steady_compiles')}"
            )
        if b.get("total_s") is not None:
            print(
                f"{'':<16} best plain by steady ({r['best_plain_steady']}): {b['total_s']:.2f} s "
                f"total, steady {_ms(b, 'steady_time_per_item_s')} ms/item (p50 {_ms(b, 'p50_s')})"
            )
        if r.get("pick_and_best_plain_one_call") is False:
            print(f"{'':<16} the pick and the best plain mode were replayed by different commands")
        for v, why in (r.get("plain_not_measured") or {}).items():
            print(f"{'':<16} not measured: {v}: {why}")
            b = (r.get("plain_stopped") or {}).get(v)
            if b and b.get("over_pick_total_at_least") is not None:
                print(
                    f"{'':<18} its whole stream took at least {b['total_s_at_least']:.0f} s, "
                    f"{b['over_pick_total_at_least']:.2f}x the pick's (its compiles before the "
                    f"stop, at item {b['items_done']} of {b['items']})"
                )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/stream/h200")
    ap.add_argument(
        "--only",
        type=parse_part,
        action="append",
        default=[],
        help="run this part (tune:W:STEP or plain:W:STEP; repeatable); default: every part",
    )
    ap.add_argument("--pairs", default=",".join(PAIRS), help="workload:step pairs summarized")
    ap.add_argument("--summarize", action="store_true", help="run nothing: write the summary")
    ap.add_argument("--stream-len", type=int, default=2000, help="items replayed")
    ap.add_argument(
        "--tune-stream-len",
        type=int,
        default=None,
        help="items the tune measures on: the first of the same stream (at most --stream-len; "
        "default 500 for inference, 200 for training)",
    )
    ap.add_argument("--budget", default="8m30s", help="each stream tune's budget")
    ap.add_argument("--allow-precision", default="bf16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="full")
    ap.add_argument("--plain-modes", default=",".join(PLAIN_MODES))
    ap.add_argument("--trial-timeout", type=float, default=540.0, help="seconds per replay trial")
    ap.add_argument(
        "--part-budget", default="9m30s", help="no replay trial is started after this is spent"
    )
    ap.add_argument(
        "--min-trial", type=float, default=60.0, help="seconds a replay trial needs at least"
    )
    ap.add_argument("--redo", action="store_true", help="tune again where a tune is kept")
    ap.add_argument(
        "--again-pick",
        action="store_true",
        help="plain parts: replay the pick again beside the plain modes still to replay",
    )
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    pairs = [p for p in args.pairs.split(",") if p]
    unknown = sorted(set(pairs) - set(PAIRS + CHECK_PAIRS))
    if unknown:
        ap.error(f"--pairs: unknown {unknown}; known: {', '.join(PAIRS + CHECK_PAIRS)}")
    modes = tuple(m for m in args.plain_modes.split(",") if m)
    if sorted(set(modes) - set(PLAIN_MODES)):
        ap.error(f"--plain-modes: choose from {', '.join(PLAIN_MODES)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join([sys.executable, __file__, *argv])
    if args.summarize:
        return summarize(args, out, pairs, command)
    t0 = time.monotonic()
    parts = args.only or [(k, *p.split(":")) for p in pairs for k in ("tune", "plain")]
    for kind, workload, step in parts:
        if kind == "tune":
            run_tune(args, workload, step, out, command)
        else:
            run_plain(args, workload, step, out, command, t0)
    if not args.only:
        # every part ran here: the summary too (the same command as --summarize)
        return summarize(args, out, pairs, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
