"""Every measurement kept: an SQLite store of results (store.py), what is kept of each kind of
result (records.py), the comparison of a new result with the recent past (compare.py), and the
import of existing run directories (importer.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from torchkiln.history.store import HistoryError, Store, default_path, record, resolve

__all__ = [
    "HistoryError",
    "Store",
    "add_arguments",
    "default_path",
    "from_args",
    "record",
    "resolve",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--history PATH and --no-history, for every command that measures."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--history",
        metavar="PATH",
        default=None,
        help="also append the results to this history store (default: KILN_HISTORY, else "
        f"{default_path()})",
    )
    group.add_argument(
        "--no-history", action="store_true", help="do not append the results to the history"
    )


def from_args(args: argparse.Namespace) -> str | Path | bool | None:
    """The ``history`` argument of the API functions from the parsed options."""
    if getattr(args, "no_history", False):
        return False
    return getattr(args, "history", None)
