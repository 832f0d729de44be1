"""Request traces: one JSON object per line giving a request's size per symbol, e.g.
``{"batch": 4, "seq": 77}``; and a generator of realistic ones.

    python -m torchkiln.serve.trace trace.jsonl -n 2000 --seed 0
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from torchkiln.errors import KilnUserError


def generate_trace(
    n: int,
    *,
    seed: int = 0,
    seq: tuple[int, int] = (8, 512),
    batch: tuple[int, int] = (1, 32),
    seq_median: float = 64.0,
    seq_sigma: float = 0.8,
    batch_median: float = 6.0,
    batch_sigma: float = 0.9,
) -> list[dict[str, int]]:
    """``n`` requests with log-normal sequence lengths and batch sizes, rounded and clipped.

    The defaults give a long tail: median sequence 64 tokens, ~5% above 256, a few at 512; batch
    median 6 with ~3% at the cap of 32 (a server's full batch under load). Independent draws,
    reproducible from ``seed``.
    """
    if n < 1:
        raise KilnUserError(f"a trace needs n >= 1 requests, got {n}")
    for name, (lo, hi) in (("seq", seq), ("batch", batch)):
        if not 1 <= lo <= hi:
            raise KilnUserError(f"{name} range {lo}..{hi} must satisfy 1 <= low <= high")
    rng = np.random.default_rng(seed)
    s = np.exp(rng.normal(np.log(seq_median), seq_sigma, n))
    b = np.exp(rng.normal(np.log(batch_median), batch_sigma, n))
    s = np.clip(np.rint(s), *seq).astype(int)
    b = np.clip(np.rint(b), *batch).astype(int)
    return [{"batch": int(x), "seq": int(y)} for x, y in zip(b, s, strict=True)]


def write_trace(path: str | Path, requests: Iterable[Mapping[str, int]]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for r in requests:
            fh.write(json.dumps(dict(r)) + "\n")
    return path


def read_trace(path: str | Path) -> list[dict[str, int]]:
    """Read a JSONL trace; every line must be an object of positive integer sizes, all lines
    naming the same symbols."""
    path = Path(path)
    if not path.is_file():
        raise KilnUserError(
            f"trace file {str(path)!r} does not exist (write one with --generate N)"
        )
    out: list[dict[str, int]] = []
    with path.open() as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise KilnUserError(f"{path}:{lineno}: not JSON ({exc.msg})") from exc
            if not isinstance(obj, dict) or not obj:
                raise KilnUserError(f'{path}:{lineno}: expected an object like {{"batch": 4}}')
            bad = {k: v for k, v in obj.items() if not isinstance(v, int) or v < 1}
            if bad:
                raise KilnUserError(f"{path}:{lineno}: sizes must be positive integers, got {bad}")
            if out and set(obj) != set(out[0]):
                raise KilnUserError(f"{path}:{lineno}: symbols {sorted(obj)} != {sorted(out[0])}")
            out.append(obj)
    if not out:
        raise KilnUserError(f"trace file {str(path)!r} is empty")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write a generated request trace (JSONL).")
    p.add_argument("out", help="path of the .jsonl file to write")
    p.add_argument("-n", type=int, default=2000, help="number of requests (default 2000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-seq", type=int, default=512)
    p.add_argument("--max-batch", type=int, default=32)
    a = p.parse_args(argv)
    reqs = generate_trace(
        a.n, seed=a.seed, seq=(min(8, a.max_seq), a.max_seq), batch=(1, a.max_batch)
    )
    write_trace(a.out, reqs)
    print(f"wrote {len(reqs)} requests to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
