"""A stream's inputs padded to buckets: which input dims follow which size, and the buckets."""

from __future__ import annotations

from typing import Any

from torchkiln.errors import KilnUserError
from torchkiln.workloads.stream import Stream


def _tensors(x: Any) -> dict[Any, Any]:
    import torch

    pairs = x.items() if isinstance(x, dict) else enumerate(x)
    return {k: v for k, v in pairs if isinstance(v, torch.Tensor)}


def dynamic_dims(stream: Stream) -> dict[Any, dict[int, str]]:
    """``{input: {dim: size name}}`` for the sizes that vary over the stream: a dim follows a
    size when it equals that size on every item. Sizes that never change are left fixed."""
    if not stream.sizes:
        raise KilnUserError("padding to buckets needs a stream made from sizes (a trace)")
    varying = [k for k in stream.sizes[0] if len({s[k] for s in stream.sizes}) > 1]
    out: dict[Any, dict[int, str]] = {}
    first = _tensors(stream.items[0])
    for key, t in first.items():
        for dim in range(t.dim()):
            for name in varying:
                if all(
                    _tensors(x)[key].shape[dim] == s[name]
                    for x, s in zip(stream.items, stream.sizes, strict=True)
                ):
                    out.setdefault(key, {})[dim] = name
                    break
    if not out:
        raise KilnUserError("no input dim follows the stream's varying sizes: nothing to bucket")
    return out


def stream_buckets(
    stream: Stream, how: str, warmup_items: int, learned_k: int
) -> dict[str, tuple[int, ...]]:
    """Buckets per varying size: powers of two from the stream's smallest size up to its largest
    (``pow2``), or sizes learned from the first ``warmup_items`` items, topped by the largest
    (``learned``): traffic after the sample may be larger."""
    from torchkiln.serve.buckets import learned, powers_of_two

    names = sorted({n for dims in dynamic_dims(stream).values() for n in dims.values()})
    out = {}
    for n in names:
        top = max(s[n] for s in stream.sizes)
        if how == "pow2":
            # from the smallest size seen: buckets below it would be compiled for nothing
            out[n] = tuple(powers_of_two(top, min(s[n] for s in stream.sizes)))
        else:
            sample = [s[n] for s in stream.sizes[: max(1, warmup_items)]]
            out[n] = tuple(learned(sample, learned_k, max_size=top))
    return out
