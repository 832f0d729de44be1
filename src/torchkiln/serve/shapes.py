"""Requests' shapes: declared dynamic dimensions, the signature a request must match to use the
compiled path, padding up to a bucket, and slicing outputs back to the request's sizes."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from torchkiln.errors import KilnUserError

# An input is named by its keyword (str) or its position (int), as the caller passes it.
ArgKey = int | str
DynamicDims = Mapping[ArgKey, Mapping[int, str]]


class ServeConfigError(KilnUserError):
    """BucketedModule was configured in a way that cannot work; the message says how to fix it."""


@dataclass(frozen=True)
class Request:
    """One call's arguments, positional and keyword, as the caller gave them."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def get(self, key: ArgKey) -> Any:
        if isinstance(key, int):
            return self.args[key] if key < len(self.args) else None
        return self.kwargs.get(key)

    def replace(self, values: Mapping[ArgKey, Any]) -> Request:
        args = list(self.args)
        kwargs = dict(self.kwargs)
        for key, value in values.items():
            if isinstance(key, int):
                args[key] = value
            else:
                kwargs[key] = value
        return Request(tuple(args), kwargs)

    def keys(self) -> list[ArgKey]:
        return [*range(len(self.args)), *self.kwargs]


def dense(t: Any) -> Any:
    """``t`` with the strides of a freshly allocated tensor of its shape. `is_contiguous()`
    ignores the stride of a size-1 dim, but compiled code guards on it: a batch-1 warm-up input
    cropped from a longer example had strides (160, 16, 1), a padded batch-1 request (128, 16,
    1), and every such request fell back to eager after warm-up."""
    expected, step = [], 1
    for n in reversed(t.shape):
        expected.append(step)
        step *= max(int(n), 1)
    if tuple(reversed(expected)) == tuple(t.stride()):
        return t
    import torch

    return t.clone(memory_format=torch.contiguous_format)


def _is_tensor(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


class InputSpec:
    """The declared dynamic dims, and the reference request that fixes everything else."""

    def __init__(self, dynamic_dims: DynamicDims):
        if not dynamic_dims:
            raise ServeConfigError(
                "dynamic_dims is empty; declare e.g. {'input_ids': {0: 'batch'}}"
            )
        self.dims: dict[ArgKey, dict[int, str]] = {}
        symbols: list[str] = []
        for key, dims in dynamic_dims.items():
            if not isinstance(key, (int, str)):
                raise ServeConfigError(f"dynamic_dims key {key!r} must be a keyword or a position")
            self.dims[key] = {int(d): str(s) for d, s in dims.items()}
            for s in self.dims[key].values():
                if s not in symbols:
                    symbols.append(s)
        self.symbols: tuple[str, ...] = tuple(symbols)
        self.reference: Request | None = None

    def set_reference(self, req: Request) -> None:
        for key, dims in self.dims.items():
            t = req.get(key)
            if not _is_tensor(t):
                raise ServeConfigError(
                    f"dynamic input {key!r} is not a tensor in the example "
                    f"(got {type(t).__name__}); name inputs as they are passed: keywords by "
                    "name, positionals by index"
                )
            bad = [d for d in dims if not -t.dim() <= d < t.dim()]
            if bad:
                raise ServeConfigError(f"input {key!r} has rank {t.dim()}, no dim {bad[0]}")
        self.dims = {
            k: {d % req.get(k).dim(): s for d, s in v.items()} for k, v in self.dims.items()
        }
        self.reference = req

    def mismatch(self, req: Request) -> tuple[str, str] | None:
        """(category, message) when ``req`` differs from the reference in anything but its
        declared dynamic sizes; None when it matches."""
        ref = self.reference
        assert ref is not None
        if len(req.args) != len(ref.args) or set(req.kwargs) != set(ref.kwargs):
            return "arguments", (f"arguments {req.keys()} differ from the warmed-up {ref.keys()}")
        for key in ref.keys():
            a, r = req.get(key), ref.get(key)
            if _is_tensor(r):
                if not _is_tensor(a):
                    return "arguments", f"input {key!r} is {type(a).__name__}, not a tensor"
                if a.dim() != r.dim():
                    return "rank", f"input {key!r} has rank {a.dim()}, warmed up {r.dim()}"
                if a.dtype != r.dtype:
                    return "dtype", f"input {key!r} is {a.dtype}, warmed up {r.dtype}"
                if a.device != r.device:
                    return "device", f"input {key!r} is on {a.device}, warmed up {r.device}"
                dyn = self.dims.get(key, {})
                for d in range(a.dim()):
                    if d not in dyn and a.shape[d] != r.shape[d]:
                        return "static_dim", (
                            f"input {key!r} dim {d} is {a.shape[d]}, warmed up {r.shape[d]} "
                            "(not declared dynamic)"
                        )
            elif a is not r and a != r:
                return "arguments", f"argument {key!r}={a!r} differs from the warmed-up {r!r}"
        return None

    def sizes(self, req: Request) -> dict[str, int] | str:
        """Each symbol's size in ``req``, or a message when two inputs disagree on one."""
        out: dict[str, int] = {}
        for key, dims in self.dims.items():
            t = req.get(key)
            for d, sym in dims.items():
                n = int(t.shape[d])
                if out.setdefault(sym, n) != n:
                    return f"symbol {sym!r} is {out[sym]} in one input and {n} in {key!r}"
        return out

    def pad(
        self, req: Request, target: Mapping[str, int], pad_values: Mapping[ArgKey, Any]
    ) -> Request:
        """Pad each dynamic input up to ``target``; every tensor comes back contiguous, because
        compiled code guards on strides and a strided request would otherwise recompile."""
        new: dict[ArgKey, Any] = {}
        for key in req.keys():
            t = req.get(key)
            if not _is_tensor(t):
                continue
            dims = self.dims.get(key)
            if not dims:
                new[key] = dense(t)
                continue
            shape = list(t.shape)
            for d, sym in dims.items():
                shape[d] = target[sym]
            if list(t.shape) == shape:
                # A new tensor object (same storage): marking it dynamic must not mark the
                # caller's tensor, which may go on to other compiled code.
                new[key] = dense(t.detach())
                continue
            out = t.new_full(shape, pad_values.get(key, 0))
            out[tuple(slice(0, n) for n in t.shape)] = t
            new[key] = out
        return req.replace(new)

    def resize(self, req: Request, target: Mapping[str, int]) -> Request:
        """The reference request tiled or cropped to ``target`` sizes: realistic values in every
        position (token ids stay valid ids, masks stay ones), for warm-up and dry runs."""
        new: dict[ArgKey, Any] = {}
        for key, dims in self.dims.items():
            t = req.get(key)
            reps = [1] * t.dim()
            for d, sym in dims.items():
                reps[d] = -(-target[sym] // t.shape[d])
            t = t.repeat(*reps)
            for d, sym in dims.items():
                t = t.narrow(d, 0, target[sym])
            new[key] = dense(t)  # laid out as `pad` lays out a request of these sizes
        return req.replace(new)

    def mark_dynamic(self, req: Request, symbols: Collection[str]) -> None:
        """Mark the dims of ``symbols`` dynamic so one compiled graph serves all their buckets.

        maybe_mark_dynamic lets the compiler specialise anyway where the model needs it (no error);
        size-1 dims are left alone: the compiler always specialises those, and marking them would
        be a contradiction."""
        import torch

        for key, dims in self.dims.items():
            t = req.get(key)
            for d, sym in dims.items():
                if sym in symbols and t.shape[d] > 1:
                    torch._dynamo.maybe_mark_dynamic(t, d)


def _leaf_name(path: tuple[Any, ...]) -> str:
    parts = []
    for entry in path:
        for attr in ("key", "name", "idx"):
            if hasattr(entry, attr):
                parts.append(str(getattr(entry, attr)))
                break
        else:
            parts.append(str(entry))
    return ".".join(parts)


class OutputSlicer:
    """Which output dims follow which symbol; slices a padded result back to the request.

    ``declared`` maps output names (pytree paths joined by '.', e.g. 'logits' or '0') to
    {dim: symbol}; a mapping with int keys ({0: 'batch'}) applies to every tensor output.
    Undeclared, they are inferred from two eager dry runs at different sizes.
    """

    def __init__(self, declared: Mapping[Any, Any] | None):
        self.declared = declared
        self.by_leaf: list[dict[int, str]] | None = None

    def resolve(self, sample_out: Any) -> None:
        from torch.utils._pytree import tree_flatten_with_path

        pairs, _ = tree_flatten_with_path(sample_out)
        names = [_leaf_name(p) for p, _ in pairs]
        d = self.declared or {}
        if d and all(isinstance(k, int) for k in d):
            self.by_leaf = [dict(d) if _is_tensor(leaf) else {} for _, leaf in pairs]
            return
        unknown = sorted(set(map(str, d)) - set(names))
        if unknown:
            raise ServeConfigError(f"output_dims names {unknown}; the model's outputs are {names}")
        self.by_leaf = [{int(k): v for k, v in d.get(n, {}).items()} for n in names]

    def infer(
        self,
        run: Callable[[Mapping[str, int]], Any],
        probe_a: Mapping[str, int],
        probe_b: Mapping[str, int],
    ) -> None:
        """Run the model at two sizes per symbol; an output dim follows a symbol when it equals
        that symbol's size in both runs. A dim that changes otherwise has no rule to slice by."""
        from torch.utils._pytree import tree_flatten_with_path

        out_a, _ = tree_flatten_with_path(run(probe_a))
        out_b, _ = tree_flatten_with_path(run(probe_b))
        self.by_leaf = []
        for (path, a), (_, b) in zip(out_a, out_b, strict=True):
            dims: dict[int, str] = {}
            if _is_tensor(a):
                for d in range(a.dim()):
                    na, nb = a.shape[d], b.shape[d]
                    hits = [s for s in probe_a if probe_a[s] == na and probe_b[s] == nb]
                    if len(hits) > 1 and na != nb:
                        raise ServeConfigError(
                            f"output {_leaf_name(path)!r} dim {d} could follow any of {hits}; "
                            "declare output_dims"
                        )
                    if len(hits) == 1 and probe_a[hits[0]] != probe_b[hits[0]]:
                        dims[d] = hits[0]
                    elif na != nb:
                        raise ServeConfigError(
                            f"output {_leaf_name(path)!r} dim {d} changes ({na} vs {nb}) but "
                            "equals no input symbol; declare output_dims"
                        )
            self.by_leaf.append(dims)

    def slice(self, out: Any, sizes: Mapping[str, int]) -> Any:
        """Cut each output to the request's sizes and copy it: under CUDA graphs the padded
        output is a static buffer that the next replay overwrites."""
        from torch.utils._pytree import tree_flatten, tree_unflatten

        assert self.by_leaf is not None
        leaves, spec = tree_flatten(out)
        if len(leaves) != len(self.by_leaf):
            raise ServeConfigError(
                f"the model returned {len(leaves)} outputs, {len(self.by_leaf)} when warmed up"
            )
        cut = []
        for leaf, dims in zip(leaves, self.by_leaf, strict=True):
            if _is_tensor(leaf):
                for d, sym in dims.items():
                    leaf = leaf.narrow(d, 0, sizes[sym])
                leaf = leaf.clone()
            cut.append(leaf)
        return tree_unflatten(cut, spec)
