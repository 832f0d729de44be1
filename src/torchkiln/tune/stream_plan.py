"""The candidates a tune measures on a stream: ways of compiling that deal with varying shapes.

A stream candidate is a variant spec with, optionally, one stream-only modifier after it:

- ``+recompile_limit=N``: dynamo may compile N graphs per frame before it runs the frame eagerly;
- ``+bucket=pow2`` / ``+bucket=learned``: inputs padded up to bucket sizes by
  ``torchkiln.serve.BucketedModule`` (powers of two, or sizes learned from the stream's warm-up
  part), one compile per bucket, all of them before the stream starts;
- ``+mark_dynamic``: ``torch._dynamo.mark_dynamic`` on each input dim that follows a varying size,
  before each call, with ``dynamic`` left unset: one dynamic graph from the first call on, where
  automatic dynamic compiles a static graph first and recompiles at the first change.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchkiln.errors import KilnUserError
from torchkiln.variants import parse_variant

RAISED_RECOMPILE_LIMIT = 64  # above the number of distinct shapes a tune's stream usually holds
BUCKETINGS = ("pow2", "learned")
# Buckets learned per varying size: four compiles. Not little padding: on bert-base's default
# training stream (2,000 items, median 64 tokens, tail to 512) the four learned sizes padded the
# steps to 1.5x their real tokens, and the steps ran 3.1x as fast as reduce-overhead's on an H100
# (stream/h100/bert-base-train-plain/, padding_waste 0.50).
LEARNED_BUCKETS = 4


@dataclass(frozen=True)
class StreamCandidate:
    variant: str  # the variant spec, without the stream-only modifier
    recompile_limit: int | None = None
    bucket: str | None = None
    mark_dynamic: bool = False

    @property
    def name(self) -> str:
        if self.bucket:
            return f"{self.variant}+bucket={self.bucket}"
        name = self.variant
        if self.recompile_limit:
            name += f"+recompile_limit={self.recompile_limit}"
        if self.mark_dynamic:
            name += "+mark_dynamic"
        return name


def parse_stream_candidate(name: str) -> StreamCandidate:
    """``inductor:dynamic=false+bf16+bucket=pow2`` -> the variant and its stream modifier."""
    parts = name.split("+")
    keep, limit, bucket, mark = [], None, None, False
    for p in parts:
        key, _, value = p.partition("=")
        if p == "mark_dynamic":
            mark = True
        elif key == "mark_dynamic":
            raise KilnUserError(f"{name!r}: +mark_dynamic takes no value")
        elif key == "recompile_limit":
            if not value.isdigit() or int(value) < 1:
                raise KilnUserError(f"{name!r}: recompile_limit must be a positive integer")
            limit = int(value)
        elif key == "bucket":
            if value not in BUCKETINGS:
                raise KilnUserError(f"{name!r}: bucket must be one of {', '.join(BUCKETINGS)}")
            bucket = value
        else:
            keep.append(p)
    v = parse_variant("+".join(keep))
    if mark:
        if bucket:
            raise KilnUserError(f"{name!r}: +mark_dynamic and +bucket= exclude each other")
        if getattr(v.backend, "dynamic", None) != "auto":
            raise KilnUserError(
                f"{name!r}: +mark_dynamic takes a compiling variant with dynamic left unset, "
                "such as inductor or inductor:mode=reduce-overhead"
            )
    return StreamCandidate(v.spec, limit, bucket, mark)


def stream_candidates(
    device: str, allow_precision: set[str], *, can_bucket: bool = True, can_mark: bool = True
) -> list[StreamCandidate]:
    """(``can_bucket``) padding to buckets, learned then powers of two, (``can_mark``) the
    varying dims marked dynamic, dynamic=true, automatic dynamic (dynamic left unset) and
    static with a raised recompile limit, each under default and reduce-overhead (on CUDA), at
    each allowed precision and fp32. Marking and bucketing need a stream made from sizes, one of
    them varying.

    In that order because a budget may end before the last: bucketing first, whose compiles
    all come before the stream (bert-base inference, bf16, on an H200: learned buckets served
    4.22x eager's requests a second and 2.57x `dynamic=True`'s on 2,000 log-normal requests),
    and a raised recompile limit last, which may compile once per distinct shape."""
    modes = ["default", "reduce-overhead"] if device.startswith("cuda") else ["default"]
    allowed = sorted(p for p in allow_precision if p in ("bf16", "fp16", "tf32"))
    # on a GPU an allowed 16-bit precision first, as the fixed-input search leads with it
    # (tune.search.EXACT_AFTER): a short budget reaches the likely winner; fp32 after
    precisions = [*allowed, "fp32"] if device.startswith("cuda") else ["fp32", *allowed]
    out: list[StreamCandidate] = []
    for precision in precisions:
        tail = "" if precision == "fp32" else f"+{precision}"
        ways: list[list[StreamCandidate]] = [[] for _ in range(6)]
        for mode in modes:
            head = "inductor" + ("" if mode == "default" else f":mode={mode}")
            sep = "," if ":" in head else ":"
            auto = parse_variant(f"{head}{tail}").spec
            static = parse_variant(f"{head}{sep}dynamic=false{tail}").spec
            if can_bucket:
                ways[0].append(StreamCandidate(static, bucket="learned"))
                ways[1].append(StreamCandidate(static, bucket="pow2"))
            if can_mark:
                ways[2].append(StreamCandidate(auto, mark_dynamic=True))
            ways[3].append(StreamCandidate(parse_variant(f"{head}{sep}dynamic=true{tail}").spec))
            ways[4].append(StreamCandidate(auto))
            ways[5].append(StreamCandidate(static, recompile_limit=RAISED_RECOMPILE_LIMIT))
        out += [c for way in ways for c in way]
    return out
