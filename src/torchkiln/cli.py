"""`kiln` entry point: parse, call the API, print. Bad input exits 2 with a clear message."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from torchkiln import __version__, defaults
from torchkiln.cli_args import (
    KilnParser,
    add_stop_interval,
    budget_arg,
    check_inputs,
    debug_everywhere,
    default_run_dir,
    failed_exit,
    interrupted_hint,
    non_negative_float,
    positive_float,
    positive_int,
    whole_paragraph,
)
from torchkiln.errors import KilnUserError


def _add_bench(sub: argparse._SubParsersAction) -> None:
    from torchkiln.api import DEFAULT_VARIANTS
    from torchkiln.cli_stream import add_stream_options
    from torchkiln.variants.base import backend_choices

    backends = ", ".join(
        f"{name}({', '.join(f'{k}={v}' for k, v in params.items())})" if params else name
        for name, params in backend_choices().items()
    )
    p = sub.add_parser(
        "bench",
        help="measure variants of one workload against a baseline, each trial in its own process",
        description=(
            "Each (workload, variant) trial runs in a fresh process. Backends: "
            f"{backends}. Policies: +fp32 +tf32 +bf16 +fp16 +channels_last."
        ),
    )
    p.add_argument(
        "workload",
        help="a registered name (see `kiln workloads`), file.py:factory or pkg.module:factory",
    )
    p.add_argument(
        "--variants",
        help="comma-separated specs (a spec's own commas are fine: a new spec starts where a "
        "backend name follows a comma); default on cuda: "
        f"{','.join(DEFAULT_VARIANTS['cuda'])}; on cpu: "
        f"{','.join(DEFAULT_VARIANTS['cpu'])}",
    )
    p.add_argument("--baseline", default="eager", help="the spec every variant is paired with")
    _add_common(p)
    p.add_argument("--reps", type=positive_int, default=None, help="paired timed reps (default 15)")
    add_stop_interval(p)
    p.add_argument(
        "--rep-ms", type=positive_float, default=None, help="target ms per rep (default 100)"
    )
    p.add_argument(
        "--replicas",
        type=int,  # checked in cmd_bench, whose message says what an instance is
        default=None,
        help="K > 1: K instances of each arm, the interval over the K pairs, so it includes "
        "instance-to-instance variation (about 1%% on host-bound GPU steps); K times the work. "
        "A t interval with K - 1 degrees of freedom: use 4 or more (at K = 2 it is 6x wider)",
    )
    p.add_argument("--no-check", action="store_true", help="skip the correctness check")
    add_stream_options(p)
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=defaults.TRIAL_TIMEOUT_S,
        help="seconds per trial (default %(default).0f)",
    )
    p.add_argument(
        "--json", dest="json_path", help="also write the results here ('-': stdout, no table)"
    )
    p.add_argument(
        "--fail-on",
        choices=["never", "all", "any"],
        default="all",
        help="exit 1 when every trial failed (all, the default), when any did (any), or never",
    )
    p.add_argument("--out", help="run directory (default kiln-runs/<time>-<workload>-<step>)")
    p.add_argument("--resume", help="continue the run in this directory, skipping done trials")
    p.add_argument(
        "--cache-dir",
        help="share this compile cache between trials (default: a "
        "fresh cache per trial, so compile times are cold)",
    )
    p.add_argument(
        "--dist",
        choices=["ddp", "fsdp"],
        default=None,
        help="run each training trial through torchrun, the model wrapped in DDP or FSDP2",
    )
    p.add_argument(
        "--nproc", type=positive_int, default=None, help="ranks per trial with --dist (default 1)"
    )
    p.add_argument(
        "--executor",
        choices=["local", "pool", "ray"],
        default="local",
        help="where trials run: one after another (local), one per visible GPU at once "
        "(pool), or one Ray task each (ray; needs the 'ray' extra)",
    )
    p.add_argument("--address", help="with --executor ray: the cluster to join (default: local)")
    _add_history_options(p)


def _add_common(p: argparse.ArgumentParser) -> None:
    """The step, device, preset and batch size, as bench and tune take them."""
    p.add_argument(
        "--step",
        choices=["infer", "train"],
        default=defaults.STEP,
        help="what is timed: a forward (infer, under inference_mode) or a forward, backward "
        "and optimizer step (train) (default %(default)s)",
    )
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda if present)")
    p.add_argument(
        "--preset",
        choices=list(defaults.PRESETS),
        default=defaults.PRESET,
        help="workload size: auto = full on a GPU, tiny on the CPU (default %(default)s)",
    )
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=None,
        help="the workload's batch size (default: the workload's own)",
    )


def _default_device() -> str:
    return defaults.device(None)


def _check_device(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise KilnUserError("--device cuda was asked for, but no CUDA GPU is visible")
    elif device != "cpu":
        raise KilnUserError(f"--device {device!r}; choose from ['cpu', 'cuda', 'cuda:N']")


class _Progress:
    """A rich progress bar over trials, with the running trial's phase."""

    def __init__(self, total: int, to_stderr: bool = False) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        from torchkiln.console import make_console

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=make_console(stderr=to_stderr),
            transient=False,
        )
        self.task = self.progress.add_task("starting", total=total)

    def __enter__(self) -> _Progress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def preflight(self, timeout_s: float) -> None:
        # A factory that builds a large model (or hangs) takes this long before any trial.
        self.progress.update(
            self.task,
            description=f"loading the workload (one eager forward; limit {timeout_s:.0f} s)",
        )

    def trial_started(self, index, total, spec) -> None:
        self.progress.update(self.task, description=f"{spec.variant}: starting")

    def trial_phase(self, spec, phase) -> None:
        label = {"first_call": "compiling (first call)", "measure": "measuring"}.get(phase, phase)
        self.progress.update(self.task, description=f"{spec.variant}: {label}")

    def trial_finished(self, spec, result, resumed) -> None:
        how = "resumed" if resumed else result["status"]
        self.progress.console.print(f"  {spec.variant}: {how}")
        self.progress.advance(self.task)


def cmd_bench(args: argparse.Namespace) -> int:
    from torchkiln.api import bench, default_variants
    from torchkiln.backends.distributed.config import check_dist
    from torchkiln.backends.distributed.launch import dist_summary_lines
    from torchkiln.cli_stream import cmd_bench_stream, wants_stream
    from torchkiln.report.table import render
    from torchkiln.runner.launch.executors import make_executor
    from torchkiln.variants import parse_variant, split_variants

    device = args.device or _default_device()
    _check_device(device)
    variants = split_variants(args.variants) if args.variants else default_variants(device)
    for spec in [*variants, args.baseline]:  # a bad spec is reported before any progress bar
        if wants_stream(args):
            from torchkiln.tune.stream_plan import parse_stream_candidate

            parse_stream_candidate(spec)  # a stream takes its modifiers too (stream_plan)
        else:
            parse_variant(spec)
    check_inputs(args, dirs=("out", "cache_dir"), files=("json_path",))
    args.run_dir = args.resume or args.out or default_run_dir(args.workload, args.step)
    if wants_stream(args):
        return cmd_bench_stream(args, device, variants)
    overrides: dict[str, Any] = {"check_accuracy": not args.no_check}
    overrides["stop_halfwidth"] = args.stop_interval
    if args.reps:
        overrides["reps"] = args.reps
    if args.rep_ms:
        overrides["rep_ms"] = args.rep_ms
    if args.replicas is not None:
        if args.replicas < 1:
            raise KilnUserError(f"--replicas {args.replicas}: give 1 or more instances per arm")
        overrides["replicas"] = args.replicas
    check_dist(args.dist, args.nproc, args.step)  # bad options fail before any progress bar
    executor = make_executor(args.executor, device=device, address=args.address)
    with _Progress(len(variants), to_stderr=args.json_path == "-") as progress:
        doc = bench(
            args.workload,
            variants,
            step=args.step,
            device=device,
            preset=args.preset,
            baseline=args.baseline,
            batch_size=args.batch_size,
            out=args.run_dir,
            resume=args.resume,
            timeout_s=args.timeout,
            cache_dir=args.cache_dir,
            events=progress,
            spec_overrides=overrides,
            executor=executor,
            nproc=args.nproc,
            dist=args.dist,
            history=_history_of(args),
        )
    if args.json_path == "-":
        print(json.dumps(doc, indent=2, default=str))
    else:
        render(doc)
        if args.dist:
            print("\n".join(dist_summary_lines(doc)))
    if args.json_path and args.json_path != "-":
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps(doc, indent=2, default=str))
    _print_history(doc)
    return failed_exit(doc["trials"], args.fail_on)


def _add_tune(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune",
        help="the main job: search variants, prove them correct, recommend, report",
        description="Environment check, eager baseline, profile verdict, graph breaks, a "
        "search over variants within the budget, selection, report (report.md, report.html, "
        "results.json in --out).",
    )
    p.add_argument(
        "workload",
        nargs="?",
        default="simple",
        help="a registered name (see `kiln workloads`), file.py:factory or pkg.module:factory "
        "(default %(default)s)",
    )
    _add_common(p)
    p.add_argument(
        "--budget",
        type=budget_arg,
        default=defaults.BUDGET,
        help="wall-time budget, e.g. 15m, 90s, 1h (auto: 15m on a GPU, 4m on the CPU, so that "
        "the default command ends within 5 minutes on a 2-core machine)",
    )
    p.add_argument(
        "--steps",
        type=positive_int,
        default=None,
        help="how many steps your job runs: minimise compile + N x step time",
    )
    p.add_argument(
        "--allow-precision",
        default="",
        help="numerics-changing precisions kiln may pick: bf16,tf32,fp16",
    )
    p.add_argument("--out", default=None, help="report directory (default kiln-runs/tune-...)")
    p.add_argument(
        "--reps",
        type=positive_int,
        default=None,
        help="paired timed reps per trial (default 15)",
    )
    add_stop_interval(p)
    p.add_argument(
        "--compile-workers",
        type=positive_int,
        default=None,
        help="trials in flight on one GPU: their compiles overlap, their timed reps take "
        "turns (default: from the host's cores and memory and the GPU's, at most 4; "
        "KILN_COMPILE_WORKERS; 1 on the CPU)",
    )
    from torchkiln.cli_stream import add_stream_options

    add_stream_options(p)  # tune on a stream of varying shapes (docs/streams.md)
    _add_history_options(p)
    p.add_argument(
        "--ship",
        action="store_true",
        help="then ship the pick to OUT/ship (as `kiln ship OUT`)",
    )
    p.add_argument(
        "--variants",
        default=None,
        help="measure exactly these candidates (comma-separated specs, as `kiln bench "
        "--variants`) instead of the search's plan: no profile or explain stage, no "
        "refinements; eager is the baseline either way",
    )
    p.add_argument(
        "--fix",
        default="code",
        metavar="none|config|code",
        help="remedies for graph breaks measured as candidates: code (default: source rewrites "
        "of a copy and configuration), config (Dynamo settings only) or none",
    )


class _TuneProgress:
    """The tune's live console. Candidates deferred for want of time, and those skipped when
    they still do not fit at their second turn, are gathered into one line each: a 2-minute
    tune on an H200 printed six deferrals and five skips of the same candidates, 30 wrapped
    lines (torch 2.11, measured at commit e1ee3fb)."""

    def __init__(self, console: Any = None) -> None:
        from torchkiln.console import make_console

        self.console = console or make_console(stderr=True)
        self._deferred: set[str] = set()
        # kind -> (spec, estimated s, s left), as the budget reason gives them
        self._held: dict[str, list[tuple[str, str, str]]] = {"deferred": [], "skipped": []}

    def flush(self) -> None:
        """Print the gathered deferrals and skips (at the next other event, and at the end)."""
        labels = {
            "deferred": "[dim]deferred to a second turn (not fitting what is left yet)",
            "skipped": "[yellow]skipped[/yellow] [dim]at their second turn (still not fitting)",
        }
        from rich.markup import escape

        for kind, held in self._held.items():
            if held:
                names = ", ".join(
                    f"{escape(spec)} (~{need} s)" if need else escape(spec)
                    for spec, need, _ in held
                )
                left = held[-1][2]
                tail = f"; {left} s left" if left else ""
                self.console.print(f"  {labels[kind]}: {names}{tail}[/dim]", highlight=False)
                held.clear()

    def stage(self, name, detail, seconds_left) -> None:
        self.flush()
        left = _left(seconds_left)
        self.console.print(f"[bold]{name}[/bold] {detail}  [dim]({left})[/dim]")

    def trial_phase(self, spec, phase, seconds_left) -> None:
        # A pooled trial's wait for its turn on the host shows as "<phase> (waiting for ...)".
        if phase not in ("first_call", "measure", "correctness_compile") and "waiting" not in phase:
            return
        self.flush()
        label = {"first_call": "compiling (first call)", "measure": "measuring"}.get(phase, phase)
        self.console.print(f"  [dim]{spec}: {label} ({_left(seconds_left)})[/dim]")

    def trial_done(self, result, seconds_left) -> None:
        self.flush()
        sp = (result.get("speedup") or {}).get("median")
        over = result.get("baseline") or "eager"
        extra = f" {sp:.2f}x over {over}" if sp else f" {result.get('reason') or ''}"
        if result.get("reused"):
            extra += " (reused: finished in an earlier run into this directory, same settings)"
        self.console.print(f"  {result['variant']}: {result['status']}{extra}", highlight=False)

    def skipped(self, spec, why) -> None:
        if spec in self._deferred:
            self._held["skipped"].append((spec, *_estimate_of(why)))
            return
        self.flush()
        from rich.markup import escape

        self.console.print(
            f"  [yellow]skipped[/yellow] {escape(spec)}: {escape(why)}", highlight=False
        )

    def deferred(self, spec, why) -> None:
        self._deferred.add(spec)
        self._held["deferred"].append((spec, *_estimate_of(why)))


def _left(seconds: float) -> str:
    """The budget left, never negative: past the budget the final stages use their reserve."""
    if seconds > -0.5:
        return f"{max(0.0, seconds):.0f} s left"
    return f"past the budget by {-seconds:.0f} s"


def _estimate_of(why: str) -> tuple[str, str]:
    """(estimated s, s left) out of a budget reason (tune.pipeline's `fits`), else blanks."""
    import re

    found = re.search(r"estimated (\d+) s, (\d+) s left", why)
    return (found[1], found[2]) if found else ("", "")


def _auto_budget(budget: str, device: str) -> str:
    return str(defaults.budget(budget, device))


def cmd_tune(args: argparse.Namespace) -> int:
    from torchkiln.api import resolve_preset
    from torchkiln.tune.api import parse_budget
    from torchkiln.tune.pipeline import tune
    from torchkiln.variants.base import NUMERICS_CHANGING, split_variants

    device = args.device or _default_device()
    _check_device(device)
    allow = {p for p in args.allow_precision.split(",") if p}
    bad = allow - NUMERICS_CHANGING
    if bad:
        raise KilnUserError(
            f"--allow-precision {sorted(bad)}; choose from {sorted(NUMERICS_CHANGING)}"
        )
    from torchkiln.repair.plan import check_mode

    check_mode(args.fix)
    if (args.stream or args.stream_len) and args.ship:
        raise KilnUserError("--ship takes a fixed-input tune; a tune on a stream prints its code")
    out = args.out or f"kiln-runs/tune-{args.workload.replace('/', '_')}-{args.step}"
    check_inputs(args, dirs=("out",))
    args.run_dir = out
    progress = _TuneProgress()
    doc = tune(
        args.workload,
        step=args.step,
        device=device,
        preset=resolve_preset(args.preset, device),
        batch_size=args.batch_size,
        budget_s=parse_budget(_auto_budget(args.budget, device)),
        steps=args.steps,
        allow_precision=allow,
        out=out,
        events=progress,
        spec_overrides={"stop_halfwidth": args.stop_interval}
        | ({"reps": args.reps} if args.reps else {}),
        history=_history_of(args),
        fix=args.fix,
        compile_workers=args.compile_workers,
        stream=args.stream,
        stream_len=args.stream_len,
        variants=None if args.variants is None else split_variants(args.variants),
    )
    progress.flush()  # deferrals after the last stage
    from torchkiln.repair.report import console_lines
    from torchkiln.tune.recommend import summary_lines
    from torchkiln.tune.time_spent import console_line as time_spent_line

    lines = summary_lines(doc, out)
    if doc.get("recommendation"):  # the remedies the pick ships, before the closing report line
        lines[-1:-1] = console_lines(doc, out)
    if spent := time_spent_line(doc.get("time_spent")):
        lines.append(spent)
    print("\n".join(lines))
    _print_history(doc)
    if args.ship:
        from torchkiln.ship import cli as ship_cli

        return ship_cli.run(
            argparse.Namespace(dir=out, to=None, package="auto", check=False, no_measure=False)
        )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from torchkiln.report.render import rerender

    out = rerender(args.dir)
    print(f"wrote {out}/report.md and {out}/report.html")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from torchkiln.report.compare import lines, run_compare

    files = [f for f in (args.old, args.new) if f]
    if args.against:
        if len(files) != 1:
            raise KilnUserError("compare --against history[:N] takes one result: NEW")
        from torchkiln.history.commands import run_against

        return run_against(args, files[0])
    if len(files) != 2:
        raise KilnUserError("compare takes OLD and NEW (or --against history[:N] NEW)")
    code, comparison = run_compare(args.old, args.new, args.threshold)
    print("\n".join(lines(comparison)))
    return code


def cmd_workloads(args: argparse.Namespace) -> int:
    from torchkiln.workloads.base import registry

    for name, entry in sorted(registry().items()):
        extra = f"  [extra: {entry.extra}]" if entry.extra else ""
        print(f"{name:12s} {entry.description}{extra}")
    return 0


def cmd_variants(args: argparse.Namespace) -> int:
    from torchkiln.variants.base import (
        LAYOUTS,
        PRECISIONS,
        allowed_values,
        backend_choices,
        backends,
    )

    for name, params in backend_choices().items():
        ps = ", ".join(f"{k}={v}" for k, v in params.items())
        print(f"{name:12s} {ps}")
        for key, allowed in allowed_values(backends()[name]).items():
            shown = " | ".join(allowed) if isinstance(allowed, list) else f"any {allowed}"
            print(f"{'':14s}{key}: {shown}")
    print(f"policies: {' '.join('+' + p for p in (*PRECISIONS, *LAYOUTS))}")
    from torchkiln.repair.report import remedy_lines

    print("\n".join(remedy_lines()))
    return 0


def _add_module_command(sub: argparse._SubParsersAction, name: str, module: str, help: str):
    """A subcommand whose module provides add_arguments(parser) and run(args) -> int."""
    import importlib

    mod = importlib.import_module(module)
    p = sub.add_parser(name, help=help, description=whole_paragraph(mod.__doc__, help))
    mod.add_arguments(p)
    p.set_defaults(module_run=mod.run)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = KilnParser(
        prog="kiln", description="Find the fastest correct way to run a PyTorch model."
    )
    parser.add_argument("--version", action="version", version=f"kiln {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for bad input")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_bench(sub)
    _add_tune(sub)
    rep = sub.add_parser("report", help="re-render report.md and report.html from results.json")
    rep.add_argument("dir")
    cmp_ = sub.add_parser("compare", help="did any variant get slower? exit 1 on a regression")
    cmp_.add_argument("old", nargs="?")
    cmp_.add_argument("new", nargs="?")
    cmp_.add_argument(
        "--threshold",
        type=non_negative_float,
        default=0.05,
        help="relative slow-down that counts, when intervals do not overlap",
    )
    _add_history_commands(sub, cmp_)
    _add_module_command(
        sub,
        "doctor",
        "torchkiln.diagnose.doctor",
        "check that this environment can compile and measure",
    )
    _add_module_command(
        sub,
        "explain",
        "torchkiln.diagnose.explain",
        "graph breaks and recompilations of a workload, with fixes",
    )
    _add_module_command(
        sub,
        "profile",
        "torchkiln.diagnose.profile",
        "where a step's time goes, layer by layer, and what to do next",
    )
    _add_module_command(
        sub,
        "serve-bench",
        "torchkiln.serve.bench",
        "replay a request trace: eager, torch.compile, bucketed",
    )
    _add_module_command(
        sub,
        "ship",
        "torchkiln.ship.cli",
        "ship a tune's pick: module, manifest, compiled artifacts; --check DIR",
    )
    kernels = sub.add_parser("kernels", help="kiln's Triton kernels")
    ksub = kernels.add_subparsers(dest="kernels_command", required=True)
    _add_module_command(
        ksub,
        "bench",
        "torchkiln.kernels.bench",
        "bandwidth of kiln's kernels vs torch and torch.compile on this GPU",
    )
    sub.add_parser("workloads", help="list the registered workloads")
    sub.add_parser("variants", help="list the backends, their parameters and the policies")
    debug_everywhere(parser)
    return parser


def _add_history_options(p: argparse.ArgumentParser) -> None:
    from torchkiln.history import add_arguments

    add_arguments(p)


def _history_of(args: argparse.Namespace) -> Any:
    from torchkiln.history import from_args

    return from_args(args)


def _print_history(doc: dict[str, Any]) -> None:
    """The history store's line: where the result was appended, or a warning saying why not."""
    from torchkiln.history.store import status_line

    line = status_line(doc.get("history") or {"off": True})
    if line:
        print(line, file=sys.stderr)


def _add_history_commands(sub: argparse._SubParsersAction, compare: Any) -> None:
    """`kiln history`, `kiln import` and compare's --against (docs/history.md)."""
    from torchkiln.history import commands

    commands.add_against(compare)
    hist = sub.add_parser("history", help="the runs in the history store, newest first")
    commands.add_history_arguments(hist)
    hist.set_defaults(module_run=commands.run_history)
    imp = sub.add_parser("import", help="load existing run directories into the history store")
    commands.add_import_arguments(imp)
    imp.set_defaults(module_run=commands.run_import)


COMMANDS = {
    "bench": cmd_bench,
    "tune": cmd_tune,
    "report": cmd_report,
    "compare": cmd_compare,
    "workloads": cmd_workloads,
    "variants": cmd_variants,
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "module_run", None) is not None:
            return args.module_run(args)
        return COMMANDS[args.command](args)
    except KilnUserError as exc:
        if args.debug:
            raise
        print(f"kiln: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"kiln: {interrupted_hint(args)}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
