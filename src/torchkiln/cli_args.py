"""Argument types and the parser class of `kiln`: every value is checked where it is parsed,
and a refused one ends in one line naming the option, what was given and what is allowed."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn


def _number(text: str, kind: type, what: str, ok: Callable[[float], bool]) -> Any:
    """``text`` as ``kind`` when ``ok`` holds for it; otherwise argparse's error, "must be
    ``what``"."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"must be {what}, got {value if kind is int else text}")
    return value


def positive_int(text: str) -> int:
    """1 or more (batch sizes, reps, steps, counts)."""
    return _number(text, int, "a positive integer", lambda v: v >= 1)


def non_negative_int(text: str) -> int:
    return _number(text, int, "an integer >= 0", lambda v: v >= 0)


def positive_float(text: str) -> float:
    """More than 0 (seconds, milliseconds); nan and inf are refused too."""
    return _number(text, float, "a positive number", lambda v: 0 < v < float("inf"))


def non_negative_float(text: str) -> float:
    return _number(text, float, "a number >= 0", lambda v: 0 <= v < float("inf"))


def budget_arg(text: str) -> str:
    """`auto` or a positive duration such as 15m, 90s, 1h30m or 600 (checked here, parsed by
    durations.parse_budget)."""
    from torchkiln.durations import parse_budget
    from torchkiln.errors import KilnUserError

    if text == "auto":
        return text
    try:
        seconds = parse_budget(text)
    except KilnUserError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: write it like 15m, 90s, 1h30m, 600 or auto"
        ) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 s, got {text!r}")
    return text


class KilnParser(argparse.ArgumentParser):
    """An ArgumentParser whose refusals are one line on stderr, exit 2 (argparse prints the
    whole usage first, which buries the one thing that was wrong)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def whole_paragraph(doc: str | None, fallback: str) -> str:
    """A module docstring's first paragraph, joined into one text (its first line alone stops
    mid-sentence)."""
    text = (doc or "").strip()
    if not text:
        return fallback
    return " ".join(text.split("\n\n")[0].split())


def debug_everywhere(parser: argparse.ArgumentParser) -> None:
    """`--debug` after any subcommand too (`kiln tune nosuch --debug`), not only before it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                if "--debug" not in sub._option_string_actions:
                    sub.add_argument(
                        "--debug",
                        action="store_true",
                        default=argparse.SUPPRESS,
                        help="show tracebacks for bad input",
                    )
                debug_everywhere(sub)


def check_inputs(
    args: argparse.Namespace, dirs: tuple[str, ...] = (), files: tuple[str, ...] = ()
) -> None:
    """Before any work: a workload name that is not registered, and output paths kiln could
    not write, end the command (KilnUserError: exit 2, one line)."""
    from torchkiln.errors import KilnUserError
    from torchkiln.outputs import check_output_dir, check_output_file

    check_device(getattr(args, "device", None))
    workload = getattr(args, "workload", None)
    target = (workload or "").rpartition(":")[0]
    if (target.endswith(".py") or "/" in target) and not Path(target).is_file():
        raise KilnUserError(
            f"workload {workload!r}: {target!r} does not exist; give path/to/file.py:factory, "
            "pkg.module:factory or a registered name (see `kiln workloads`)"
        )
    if workload is not None and ":" not in workload:
        from torchkiln.workloads.base import registry

        names = sorted(registry())
        if workload not in names:
            raise KilnUserError(
                f"unknown workload {workload!r}; choose from {names} or give "
                "'path/to/file.py:factory' or 'pkg.module:factory'"
            )
    for name in dirs:
        check_output_dir(_option(name), getattr(args, name, None))
    for name in files:
        check_output_file(_option(name), getattr(args, name, None))


def check_device(device: str | None) -> None:
    """None (auto), cpu, cuda or cuda:N, the last two only where a GPU is visible."""
    from torchkiln.errors import KilnUserError

    if device is None or device == "cpu":
        return
    if device == "cuda" or re.fullmatch(r"cuda:\d+", device):
        import torch

        if not torch.cuda.is_available():
            raise KilnUserError(f"--device {device} was asked for, but no CUDA GPU is visible")
        return
    raise KilnUserError(f"--device {device!r}; choose from ['cpu', 'cuda', 'cuda:N']")


def _option(dest: str) -> str:
    return "--json" if dest == "json_path" else "--" + dest.replace("_", "-")


def default_run_dir(workload: str, step: str) -> str:
    import time

    return str(Path("kiln-runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{Path(workload).stem}-{step}")


FAIL_ON = ("never", "all", "any")


def failed_exit(trials: list[dict], fail_on: str) -> int:
    """`kiln bench`'s exit code for CI: 1 when every trial failed (`all`), or any did."""
    failed = [t for t in trials if t.get("status") != "ok"]
    if not failed or fail_on == "never":
        return 0
    if fail_on == "all" and len(failed) < len(trials):
        return 0
    which = "every trial" if len(failed) == len(trials) else f"{len(failed)} of {len(trials)}"
    shown = ", ".join(f"{t.get('variant')} ({t.get('status')})" for t in failed[:4])
    print(f"kiln: {which} failed: {shown} (--fail-on {fail_on})", file=sys.stderr)
    return 1


def interrupted_hint(args: argparse.Namespace) -> str:
    """After a Ctrl-C: where the finished trials are, and the command that goes on from them."""
    import shlex

    where = getattr(args, "run_dir", None)
    if where is None:
        return "interrupted before any trial started"
    saved = f"interrupted; finished trials are saved in the run directory {where}"
    if args.command == "tune":
        return f"{saved}: the same command, with the same --out, reuses them"
    return f"{saved}: continue with --resume {shlex.quote(str(where))}"


def stop_interval(text: str) -> float | None:
    """The speedup interval's half-width at which timed reps stop: a fraction (0.005) or a
    percentage (0.5%); 0 runs every rep (None)."""
    raw = text.strip()
    scale = 100.0 if raw.endswith("%") else 1.0
    try:
        value = float(raw.rstrip("%")) / scale
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a fraction or a percentage such as 0.005 or 0.5%, got {text!r}"
        ) from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 0 and below 1 (100%), got {text}")
    return value or None


def add_stop_interval(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--stop-interval",
        type=stop_interval,
        default=0.005,
        help="stop a trial's timed reps once the speedup's 95%% interval is within +- this "
        "of its median, after 10 reps (default 0.5%%; 0: every rep)",
    )
