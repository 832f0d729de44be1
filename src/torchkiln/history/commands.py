"""The history's commands: `kiln history`, `kiln import`, and `kiln compare --against history`
(their options and what they print; the work is in store.py, importer.py and compare.py)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import Any

from torchkiln.errors import KilnUserError
from torchkiln.history.store import Store, default_path, resolve


def _store_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--history",
        metavar="PATH",
        default=None,
        help=f"the history store (default: KILN_HISTORY, else {default_path()})",
    )


def _open(args: argparse.Namespace, *, must_exist: bool = True) -> Store:
    path = resolve(args.history)
    if must_exist and not path.exists():
        raise KilnUserError(
            f"no history store at {str(path)!r} yet: bench, tune, serve-bench and kernels "
            "bench append to it, and `kiln import DIR` loads earlier run directories"
        )
    return Store(path)


def add_history_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("workload", nargs="?", default=None, help="only this workload's runs")
    p.add_argument("--variant", default=None, help="only this variant spec")
    p.add_argument("--since", default=None, help="only runs from this date on (YYYY-MM-DD[THH:MM])")
    p.add_argument("--limit", type=int, default=50, help="rows shown, newest first (0: all)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    _store_option(p)


def _since(text: str | None) -> str | None:
    if text is None:
        return None
    try:
        datetime.fromisoformat(text)
    except ValueError as exc:
        raise KilnUserError(f"--since {text!r}: give YYYY-MM-DD or YYYY-MM-DDTHH:MM") from exc
    return text


def _ms(r: dict[str, Any]) -> str:
    if r["median_ms"] is None:
        return "-"
    if r["lo_ms"] is None or r["lo_ms"] == r["hi_ms"] == r["median_ms"]:
        return f"{r['median_ms']:.3f}"
    return f"{r['median_ms']:.3f} [{r['lo_ms']:.3f}, {r['hi_ms']:.3f}]"


def history_table(rows: list[dict[str, Any]]) -> str:
    head = ["run", "created", "kind", "workload", "step", "variant", "precision", "device",
            "status", "ms [95% CI]", "torch", "kiln"]  # fmt: skip
    lines = [head] + [
        [str(r["run_id"]), r["created"][:19], r["kind"], r["workload"], r["step"] or "-",
         r["variant"], r["precision"], r["device_name"] or "-", r["status"], _ms(r),
         r["torch"] or "-", (r["kiln_git_sha"] or r["kiln"] or "-")[:12]]
        for r in rows
    ]  # fmt: skip
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    text = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in lines]  # fmt: skip
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(text)


def run_history(args: argparse.Namespace) -> int:
    """`kiln history`: the runs in the store, newest first."""
    since = _since(args.since)
    with _open(args) as store:
        rows = store.measurements(
            args.workload, variant=args.variant, since=since, limit=args.limit or None
        )
    if args.json:
        print(json.dumps(rows, indent=2))
    elif not rows:
        print("no runs in the history match")
    else:
        print(history_table(rows))
    return 0


def add_import_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dirs", nargs="+", metavar="DIR", help="run directories or result files")
    _store_option(p)


def run_import(args: argparse.Namespace) -> int:
    """`kiln import DIR...`: 0 when every path was imported or already there, else 1."""
    from torchkiln.history.importer import import_paths

    with _open(args, must_exist=False) as store:
        outcomes = import_paths(store, args.dirs)
    for o in outcomes:
        if o["status"] == "imported":
            print(f"{o['path']}: imported as run {o['run_id']}")
        elif o["status"] == "already":
            print(f"{o['path']}: already in the history (run {o['run_id']})")
        else:
            print(f"{o['path']}: not imported: {o['why']}", file=sys.stderr)
    return 1 if any(o["status"] == "refused" for o in outcomes) else 0


def run_against(args: argparse.Namespace, path: str) -> int:
    """`kiln compare --against history[:N] NEW`: 1 on a regression, else 0."""
    from torchkiln.history.compare import against_history, format_row, parse_against
    from torchkiln.history.importer import load

    n = parse_against(args.against)
    try:
        doc = load(path)
    except ValueError as exc:
        raise KilnUserError(f"{path!r}: {exc}") from exc
    store_path = resolve(args.history)
    if not store_path.exists():
        print(f"no history store at {store_path} yet: nothing to compare against (passes)")
        return 0
    with Store(store_path) as store:
        rows, alone = against_history(doc, store, n, args.threshold)
    for r in rows:
        print(format_row(r))
    for v in alone:
        print(f"{v:40s} no earlier comparable run in the history: nothing to compare (passes)")
    return 1 if any(r["verdict"] == "regression" for r in rows) else 0


def add_against(p: argparse.ArgumentParser) -> None:
    """`kiln compare`'s history options."""
    p.add_argument(
        "--against",
        metavar="history[:N]",
        default=None,
        help="compare NEW with the last N (default 5) comparable runs in the history store, "
        "their spread as the noise floor: `kiln compare --against history:5 NEW`",
    )
    _store_option(p)
