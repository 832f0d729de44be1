"""Ship the pick of a tune: a directory production loads with `torchkiln.load(DIR, model)`.

`kiln ship RUN_DIR` builds it (default RUN_DIR/ship) and measures each route in a fresh
process; `kiln ship --check DIR` says whether DIR's artifacts fit this machine, without
loading any model: exit 0 when they fit, 1 on a mismatch (naming the field), 2 on bad input."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from torchkiln.ship.api import PACKAGES

    p.add_argument("dir", help="a `kiln tune --out` directory; with --check, a ship directory")
    p.add_argument("--to", default=None, help="where to write the ship directory")
    p.add_argument(
        "--package",
        choices=PACKAGES,
        default="auto",
        help="auto: the compile cache, plus for inference the forward compiled ahead of time "
        "and an AOTInductor package where torch.export succeeds; cache, precompiled or aoti: "
        "that one only",
    )
    p.add_argument(
        "--no-measure", action="store_true", help="skip measuring the routes in fresh processes"
    )
    p.add_argument(
        "--check", action="store_true", help="check DIR (a ship directory) against this machine"
    )


def run(args: argparse.Namespace) -> int:
    from torchkiln.ship.api import ship
    from torchkiln.ship.manifest import check
    from torchkiln.ship.report import LABELS

    if args.check:
        problems = check(args.dir)
        for p in problems:
            print(f"mismatch: {p}")
        if not problems:
            print(f"{args.dir}: fits this machine")
        return 1 if problems else 0
    m = ship(args.dir, to=args.to, package=args.package, measure=not args.no_measure)
    to = args.to or f"{args.dir}/ship"
    print(f"shipped {m['spec']} to {to} (artifacts: {', '.join(m['artifacts']) or 'none'})")
    for key, what in (("export", "AOTInductor package"), ("precompile", "precompiled forward")):
        if m.get(key):
            print(f"  no {what}: {m[key]['reason']}; remedy: {m[key]['remedy']}")
    for name, r in (m.get("routes") or {}).items():
        if r.get("ok"):
            print(
                f"  {LABELS[name]:20s} first fast output {r['first_fast_s']:7.2f} s, "
                f"steady {r['steady_ms']['median']:.3f} ms"
            )
        else:
            print(f"  {LABELS[name]:20s} failed: {r.get('error')}")
    print(f"  load order: {', '.join(m.get('route_order') or []) or 'cold compile only'}")
    return 0
