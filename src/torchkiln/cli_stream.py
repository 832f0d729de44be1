"""``kiln bench --stream``: each variant replays the workload's stream in its own process, paired
per item with eager; results go to ``<run dir>/stream.json`` and a table."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from torchkiln.errors import KilnUserError


def add_stream_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--stream",
        metavar="FILE.jsonl",
        help='replay this trace of sizes (one object a line, e.g. {"batch": 4, "seq": 77}) '
        "instead of timing one fixed input",
    )
    p.add_argument(
        "--stream-len",
        type=int,
        default=None,
        help="items of the stream to replay (default: the whole trace, or 200 of the "
        "workload's default stream)",
    )


def wants_stream(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "stream", None) or getattr(args, "stream_len", None))


def cmd_bench_stream(args: argparse.Namespace, device: str, variants: list[str]) -> int:
    from torchkiln.api import resolve_preset
    from torchkiln.workloads.loader import load_workload
    from torchkiln.workloads.stream import workload_stream

    if args.stream and not Path(args.stream).is_file():
        raise KilnUserError(f"--stream {args.stream!r}: no such file")
    # the stream is built and checked here, before anything is written, so a bad trace fails
    # with its line named and leaves an earlier run's files as they were
    args.preset = resolve_preset(args.preset, device)
    w = load_workload(args.workload, preset=args.preset, batch_size=args.batch_size, step=args.step)
    stream = workload_stream(w, args.stream, args.stream_len)
    spec = {
        "workload": args.workload,
        "step": args.step,
        "preset": args.preset,
        "batch_size": args.batch_size,
        "device": device,
        "stream": str(Path(args.stream).resolve()) if args.stream else None,
        "stream_len": args.stream_len,
    }
    trials = [run_stream_trial({**spec, "variant": v}, args.timeout) for v in variants]
    errors = {t.get("error") for t in trials if t.get("status") == "error"}
    if len(errors) == 1 and all(t.get("status") == "error" for t in trials):
        # the same refusal in every trial is the stream's fault (an input the model does not
        # take), not a variant's: a user error, with nothing written
        raise KilnUserError(errors.pop())
    doc = {
        "kind": "stream-bench",
        "workload": args.workload,
        "items": len(stream),
        **spec,
        "trials": trials,
    }
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "stream.json").write_text(json.dumps(doc, indent=2, default=str))
    if args.json_path == "-":
        print(json.dumps(doc, indent=2, default=str))
    else:
        _render(doc)
        print(f"results: {run_dir / 'stream.json'}")
    if args.json_path and args.json_path != "-":
        Path(args.json_path).write_text(json.dumps(doc, indent=2, default=str))
    bad = [t for t in trials if t.get("status") != "ok"]
    if args.fail_on == "any" and bad or args.fail_on == "all" and len(bad) == len(trials):
        return 1
    return 0


def run_stream_trial(
    spec: dict[str, Any],
    timeout_s: float,
    *,
    own_cap_s: float | None = None,
    host_lock: str | None = None,
) -> dict[str, Any]:
    """One candidate's replay in a fresh process: on timeout its whole process group is ended
    (Inductor's compile workers too), a Ctrl-C ends it, and with KILN_HOST_TURNS it holds an
    exclusive turn throughout (its compiles and timed items interleave). Its compile caches
    (Inductor's, Triton's) are its own and start empty, so every compile it counts is one it
    paid: with the user's default cache, a candidate replayed before (by another tune, or a
    twin in this one) would load its code and read as compiling faster than it does.

    With ``host_lock`` (a pool's lock file: several trials in flight) the trial takes turns on
    it phase by phase (runner.protocol.stream_progress), and ``own_cap_s`` stops it once its
    own seconds, its waits for a turn not counted, pass the cap; ``timeout_s`` is the wall
    limit either way."""
    from torchkiln.diagnose._subproc import run_module
    from torchkiln.runner.protocol import stream_progress

    with tempfile.TemporaryDirectory(prefix="kiln-stream-") as tmp:
        sp, op = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        pp = Path(tmp) / "progress.json"
        sp.write_text(json.dumps({**spec, "progress": str(pp)}))
        caches = {
            "TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "cache" / "inductor"),
            "TRITON_CACHE_DIR": str(Path(tmp) / "cache" / "triton"),
        }
        capped: list[float] = []

        def over(elapsed_s: float) -> bool:
            if own_cap_s is None or elapsed_s <= own_cap_s:
                return False  # its own seconds cannot be more than its wall seconds
            own = stream_progress.own_seconds(stream_progress.read(pp), elapsed_s)
            if own > own_cap_s:
                capped.append(elapsed_s)
            return bool(capped)

        proc = run_module(
            "torchkiln.runner.protocol.stream_trial",
            [str(sp), str(op)],
            timeout=timeout_s,
            timed=True,
            env=caches,
            own_turns=host_lock,
            over=over,
        )
        # where a trial that left no result was: its time limit or crash explained by it
        progress = stream_progress.read(pp)
        at = stream_progress.describe(progress)
        if proc.timed_out:
            limit = f"{timeout_s:.0f} s"
            if capped:
                limit = f"its cap of {own_cap_s:.0f} s"
                if host_lock is not None:
                    limit += f" (after {capped[0]:.0f} s, its waits for the host not counted)"
            return {
                "variant": spec["variant"],
                "status": "timeout",
                "error": f"the trial ran past {limit}, {at}",
                "progress": progress,
            }
        if not op.is_file():
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return {
                "variant": spec["variant"],
                "status": "crashed",
                "error": f"exit {proc.returncode} {at}: {tail}",
                "progress": progress,
            }
        return {
            **json.loads(op.read_text()),
            "compile_cache": "fresh per trial",
            "process_wall_s": proc.elapsed_s,  # what the search's estimates learn from
        }


def _render(doc: dict[str, Any]) -> None:
    what = "training steps" if doc.get("step") == "train" else "items"
    print(f"{doc['workload']} on a stream of {doc['items']} {what} ({doc['device']})")
    head = (
        "status",
        "ms/item",
        "steady",
        "p99",
        "speedup",
        "steady x",
        "compiles",
        "fallbacks",
    )
    # the variant column as wide as its longest name: a bucketed spec runs past 30 characters
    width = max([len("variant")] + [len(t["variant"]) for t in doc["trials"]])
    print(f"{'variant':<{width}}  " + "  ".join(f"{h:>10}" for h in head))
    warm = False
    for t in doc["trials"]:
        if t.get("status") not in ("ok", "incorrect"):
            print(f"{t['variant']:<{width}}  {t['status']:>10}  {t.get('error', '')}")
            continue
        compiles = str(t["compiles"])
        if t.get("warmup_compiles"):
            # a bucketed candidate compiles its buckets before the replay: counted apart
            compiles = f"{t['warmup_compiles']}+{compiles}"
            warm = True
        row = (
            t["status"],
            f"{t['time_per_item_s'] * 1e3:.3f}",
            f"{t['steady_time_per_item_s'] * 1e3:.3f}",
            f"{t['p99_s'] * 1e3:.3f}",
            f"{t['speedup']:.2f}x",
            f"{t['steady_speedup']:.2f}x",
            compiles,
            str(t["eager_fallbacks"]),
        )
        print(f"{t['variant']:<{width}}  " + "  ".join(f"{c:>10}" for c in row))
    if warm:
        print("compiles W+R: W in a bucketed candidate's warm-up, before the replay; R during it")
    for t in doc["trials"]:
        for v in t.get("verdicts") or []:  # diagnose.stream_cost: what dominated the stream
            print(f"{t['variant']}: {v}")
