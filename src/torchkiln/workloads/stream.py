"""Input streams: the varying inputs a workload really gets, replayed in order by a stream trial.

A ``Stream`` is built from a list of input tuples, from a callable ``make(**sizes)`` plus a list of
sizes (a JSONL trace such as ``{"batch": 4, "seq": 77}`` per line), or from a generator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchkiln.errors import KilnUserError
from torchkiln.serve.trace import generate_trace, read_trace

# a tuple of positional inputs or a dict of keyword inputs, as a Workload's example_inputs
Inputs = tuple[Any, ...] | dict[str, Any]


def _as_inputs(x: Any) -> Inputs:
    return x if isinstance(x, (tuple, dict)) else (x,)


@dataclass
class Stream:
    """An ordered sequence of model inputs. ``sizes[i]`` (when known) is item i's size per symbol
    and ``origin[i]`` names where it came from (``trace.jsonl:12``), for error messages."""

    items: list[Inputs]
    sizes: list[dict[str, int]] = field(default_factory=list)
    origin: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.items:
            raise KilnUserError("the stream is empty: it needs at least one item")
        self.items = [_as_inputs(x) for x in self.items]

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Inputs]:
        return iter(self.items)

    def where(self, i: int) -> str:
        return self.origin[i] if i < len(self.origin) else f"stream item {i + 1}"

    @classmethod
    def from_items(cls, items: Iterable[Any], limit: int | None = None) -> Stream:
        """From a list or a generator of inputs (a generator is read up to ``limit`` items)."""
        out: list[Inputs] = []
        for x in items:
            if limit is not None and len(out) >= limit:
                break
            out.append(_as_inputs(x))
        return cls(out)

    @classmethod
    def from_sizes(
        cls,
        make: Callable[..., Any],
        sizes: Sequence[Mapping[str, int]],
        *,
        limits: Mapping[str, int] | None = None,
        origin: Sequence[str] | None = None,
    ) -> Stream:
        """Inputs ``make(**sizes[i])`` for each size; a size above ``limits[symbol]`` (what the
        model accepts) or an input ``make`` refuses is an error naming the item's origin."""
        if not sizes:
            raise KilnUserError("the stream is empty: it needs at least one item")
        where = list(origin) if origin else [f"stream item {i + 1}" for i in range(len(sizes))]
        items: list[Inputs] = []
        for i, s in enumerate(sizes):
            for k, v in s.items():
                if not isinstance(v, int) or v < 1:
                    raise KilnUserError(f"{where[i]}: size {k}={v!r} must be a positive integer")
                if limits and k in limits and v > limits[k]:
                    raise KilnUserError(
                        f"{where[i]}: {k}={v} is beyond what the model accepts (max {limits[k]})"
                    )
            try:
                x = make(**s)
            except TypeError as exc:
                raise KilnUserError(
                    f"{where[i]}: sizes {dict(s)} do not fit the workload ({exc})"
                ) from exc
            items.append(_as_inputs(x))
        return cls(items, [dict(s) for s in sizes], where)

    @classmethod
    def from_trace(
        cls,
        path: str | Path,
        make: Callable[..., Any],
        *,
        limits: Mapping[str, int] | None = None,
        length: int | None = None,
        required: Sequence[str] = (),
    ) -> Stream:
        """Read a JSONL trace (one object of sizes per line) and make each line's inputs.
        ``length`` keeps the first N lines; ``required`` symbols must be on every line."""
        sizes = read_trace(path)
        lines = _line_numbers(Path(path))
        if length is not None:
            if length < 1:
                raise KilnUserError(f"--stream-len must be >= 1, got {length}")
            sizes, lines = sizes[:length], lines[:length]
        for s, n in zip(sizes, lines, strict=True):
            missing = [k for k in required if k not in s]
            if missing:
                raise KilnUserError(f"{path}:{n}: missing size(s) {missing}")
        return cls.from_sizes(make, sizes, limits=limits, origin=[f"{path}:{n}" for n in lines])


def _line_numbers(path: Path) -> list[int]:
    with path.open() as fh:
        return [n for n, line in enumerate(fh, 1) if line.strip()]


def lognormal_seq_sizes(
    n: int, *, seed: int = 0, batch: int = 1, max_seq: int = 512
) -> list[dict[str, int]]:
    """Log-normal sequence lengths (median 64, tail to ``max_seq``) at a fixed batch size."""
    return [
        {"batch": batch, "seq": r["seq"]}
        for r in generate_trace(n, seed=seed, seq=(min(8, max_seq), max_seq), batch=(1, 1))
    ]


def mixed_resolution_sizes(
    n: int, *, seed: int = 0, batch: int = 1, sides: Sequence[int] = (160, 192, 224, 256, 288)
) -> list[dict[str, int]]:
    """Square images of a few resolutions in a reproducible random order."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [{"batch": batch, "side": int(sides[j])} for j in rng.integers(0, len(sides), n)]


def workload_stream(
    workload: Any, path: str | Path | None = None, length: int | None = None
) -> Stream:
    """The stream a bench or tune replays for ``workload``: the trace at ``path`` made into inputs
    by the workload's ``make_inputs``, else its ``default_sizes(n)`` sample, else its
    ``input_stream`` generator; ``length`` items (default 200 when the workload samples sizes)."""
    if path is not None or workload.default_sizes is not None:
        if workload.make_inputs is None:
            raise KilnUserError(
                f"workload {workload.name!r} does not make inputs for given sizes "
                "(its Workload has no make_inputs), so it cannot take --stream"
            )
        if path is not None:
            return Stream.from_trace(
                path, workload.make_inputs, limits=workload.size_limits, length=length
            )
        if length is not None and length < 1:
            raise KilnUserError(f"--stream-len must be >= 1, got {length}")
        sizes = workload.default_sizes(length or 200)
        return Stream.from_sizes(workload.make_inputs, sizes, limits=workload.size_limits)
    if workload.input_stream is not None:
        return Stream.from_items(workload.input_stream(), limit=length or 200)
    raise KilnUserError(
        f"workload {workload.name!r} has no stream: give --stream FILE.jsonl with a workload "
        "whose Workload has make_inputs"
    )
