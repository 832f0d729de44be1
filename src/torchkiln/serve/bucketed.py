"""BucketedModule: shape-bucketed compiled inference.

Each request is padded, dimension by dimension, up to a bucket; that bucket's compiled (and, for
CUDA-graph variants, captured) code runs; outputs are cut back to the request's sizes. What no
bucket covers runs eagerly and is counted. After `warmup()` nothing may compile.

All model execution happens on one worker thread per BucketedModule (see worker.py for why);
callers on any number of threads hand their request to it and wait.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from torchkiln.serve.buckets import BucketGrid
from torchkiln.serve.guard import (
    STRICT,
    compile_count,
    compile_settings,
    describe,
    is_recompile_error,
    resolve_guard,
)
from torchkiln.serve.shapes import (
    ArgKey,
    DynamicDims,
    InputSpec,
    OutputSlicer,
    Request,
    ServeConfigError,
)
from torchkiln.serve.stats import ServeStats
from torchkiln.serve.worker import Worker
from torchkiln.variants import Variant, parse_variant

_TRAINING = (
    "is in training mode; call model.eval() first: dropout would make outputs random and "
    "BatchNorm would take statistics from the padded rows"
)


def padding_hazards(model: Any, dynamic_dims: DynamicDims) -> list[str]:
    """Why padding would change this model's results on the real positions (empty when safe)."""
    import torch.nn as nn

    training = [name or "<model>" for name, m in model.named_modules() if m.training]
    if training:
        more = f" (and {len(training) - 3} more)" if len(training) > 3 else ""
        return [f"{', '.join(training[:3])}{more} {_TRAINING}"]
    pads_inside = any(d != 0 for dims in dynamic_dims.values() for d in dims)
    out = []
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and not m.track_running_stats:
            out.append(
                f"{name} ({type(m).__name__}) normalises with the batch's own statistics "
                "even in eval mode, so padded rows would change every row"
            )
        if pads_inside and isinstance(m, (nn.GroupNorm, nn.modules.instancenorm._InstanceNorm)):
            if not getattr(m, "track_running_stats", False):
                out.append(f"{name} ({type(m).__name__}) takes statistics over padded positions")
    return out


def _compile_statically(backend: Any) -> Any:
    """Buckets are fixed shapes: a backend left on automatic dynamic shapes would turn them into
    one generic graph after two sizes. An explicit dynamic=true is the user's to keep."""
    fields = {f.name for f in dataclasses.fields(backend)}
    if "dynamic" in fields and backend.dynamic == "auto":
        return dataclasses.replace(backend, dynamic="false")
    return backend


class BucketedModule:
    """Serve ``model`` (eval mode) at a fixed set of padded shapes.

    Args:
        model: an ``nn.Module`` in eval mode.
        dynamic_dims: ``{input: {dim: symbol}}``; inputs by keyword name or positional index, e.g.
            ``{"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}``.
        buckets: ``{symbol: sizes}``, e.g. from `powers_of_two`, `learned` or `learn_buckets`.
        variant: a kiln variant spec or `Variant` (backend, precision, layout), e.g.
            ``"inductor:mode=reduce-overhead+bf16"``; dynamic=auto is compiled as dynamic=false.
        example_inputs: a dict (keywords) or tuple (positionals) fixing everything but the dynamic
            sizes; otherwise `warmup`'s arguments, or the first request, do.
        pad_values: fill value per input (default 0: attention masks pad with zeros, so padded
            positions are ignored; token ids pad with id 0).
        output_dims: ``{output_name: {dim: symbol}}`` or ``{dim: symbol}`` for every output;
            default: inferred from two eager dry runs.
        specialize: symbols compiled into the code (one compilation per bucket size); the others
            are marked dynamic and share one compiled graph, with one CUDA graph per bucket under
            CUDA-graph variants. Default: all symbols.
        max_buckets: refuse grids larger than this (each bucket is warmed up, maybe compiled).
        recompile_guard: "auto" (set_stance where torch has it), "stance" or "config".
        synchronize: wait for the device before returning, so latency stats are complete times.
    """

    def __init__(
        self,
        model: Any,
        dynamic_dims: DynamicDims,
        buckets: Mapping[str, Sequence[int]],
        variant: str | Variant = "inductor",
        *,
        example_inputs: Mapping[str, Any] | Sequence[Any] | None = None,
        pad_values: Mapping[ArgKey, float] | None = None,
        output_dims: Mapping[Any, Any] | None = None,
        specialize: Collection[str] | None = None,
        max_buckets: int = 64,
        recompile_guard: str = "auto",
        synchronize: bool = True,
    ) -> None:
        import torch

        if not isinstance(model, torch.nn.Module):
            raise ServeConfigError(f"BucketedModule needs an nn.Module, got {type(model).__name__}")
        hazards = padding_hazards(model, dynamic_dims)
        if hazards:
            raise ServeConfigError("BucketedModule refuses this model: " + "; ".join(hazards))
        self.model = model
        self.variant = parse_variant(variant) if isinstance(variant, str) else variant
        self.backend = _compile_statically(self.variant.backend)
        first = next(iter(model.parameters()), None)
        if first is None:
            first = next(iter(model.buffers()), None)
        self.device = first.device if first is not None else torch.device("cpu")
        reason = self.backend.unsupported_reason(str(self.device))
        if reason:
            raise ServeConfigError(reason)
        self.spec = InputSpec(dynamic_dims)
        self.grid = BucketGrid({s: buckets[s] for s in buckets}, max_buckets)
        if set(self.grid.symbols) != set(self.spec.symbols):
            raise ServeConfigError(
                f"buckets name symbols {sorted(self.grid.symbols)}, dynamic_dims declare "
                f"{sorted(self.spec.symbols)}; give buckets for exactly the declared symbols"
            )
        self.specialized = set(self.grid.symbols if specialize is None else specialize)
        unknown = self.specialized - set(self.grid.symbols)
        if unknown:
            raise ServeConfigError(f"specialize names unknown symbols {sorted(unknown)}")
        self._shared = [s for s in self.grid.symbols if s not in self.specialized]
        self.pad_values = dict(pad_values or {})
        self.guard = resolve_guard(recompile_guard)
        self.synchronize = synchronize
        self._apply_matmul_precision()
        if self.variant.channels_last:
            model.to(memory_format=torch.channels_last)
        self._compiled = self.backend.wrap(model, compile_scope="model")
        self._slicer = OutputSlicer(output_dims)
        self._stats = ServeStats()
        self._lock = threading.Lock()
        self._warm = False
        # told (buckets warm, buckets in all) after each bucket of the warm-up: a stream trial's
        # progress file (runner.protocol.stream_progress)
        self._on_warm_bucket: Callable[[int, int], None] | None = None
        self._warmup_info: dict[str, Any] = {}
        self._worker = Worker(self.device)
        if example_inputs is not None:
            self.spec.set_reference(_as_request(example_inputs))

    # -- public API ---------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        if self.model.training:
            raise ServeConfigError(f"the model {_TRAINING}")
        req = Request(tuple(args), dict(kwargs))
        with self._lock:
            if self.spec.reference is None:
                self.spec.set_reference(req)
        route = self._route(req)
        if route[0] == "eager":
            _, category, message = route
            out = self._on_worker(self._run_eager, req)
            self._stats.record_eager(category, message, time.perf_counter() - t0)
            return out
        _, key, sizes = route
        out, blocked = self._on_worker(self._run_bucket, key, sizes, req)
        seconds = time.perf_counter() - t0
        if blocked is not None:
            self._stats.record_recompile(blocked)
            self._stats.record_eager("recompile", blocked, seconds)
        else:
            real, padded = 1, 1
            for s, k in zip(self.grid.symbols, key, strict=True):
                real, padded = real * sizes[s], padded * k
            self._stats.record_bucket(self.grid.label(key), seconds, real, padded)
        return out

    def warmup(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Compile (and capture) every bucket, then check each runs with compilation forbidden.
        From then on a request that would compile runs eagerly instead and is counted.
        Arguments, if given, are an example request that fixes the non-dynamic inputs."""
        if args or kwargs:
            self.spec.set_reference(Request(tuple(args), dict(kwargs)))
            if not self._slicer.declared:
                self._slicer.by_leaf = None  # re-learn output dims from the new example
        if self.spec.reference is None:
            raise ServeConfigError(
                "warmup() needs an example: pass inputs to it or example_inputs="
            )
        return self._on_worker(self._warmup_all)

    def stats(self) -> dict[str, Any]:
        out = self._stats.snapshot()
        out.update(
            warmed_up=self._warm,
            warmup=dict(self._warmup_info),
            buckets=self.grid.count,
            bucket_sizes={s: list(b) for s, b in self.grid.sizes.items()},
            specialized=sorted(self.specialized),
            variant=self.variant.spec,
            compiled_as=str(self.backend),
            recompile_guard=describe(self.guard),
        )
        return out

    def close(self) -> None:
        self._worker.close()

    def __enter__(self) -> BucketedModule:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- routing and execution ----------------------------------------------------------------

    def _route(self, req: Request) -> tuple[Any, ...]:
        bad = self.spec.mismatch(req)
        if bad:
            return ("eager", *bad)
        sizes = self.spec.sizes(req)
        if isinstance(sizes, str):
            return ("eager", "inconsistent", sizes)
        if min(sizes.values()) < 1:
            return ("eager", "empty", f"empty request {sizes}")
        key = self.grid.bucket(sizes)
        if key is None:
            return (
                "eager",
                "oversize",
                f"{sizes} exceeds the largest bucket {self.grid.largest()}",
            )
        return ("bucket", key, sizes)

    def _on_worker(self, fn: Any, *args: Any) -> Any:
        return self._worker.run(fn, *args)

    def _precision(self) -> contextlib.AbstractContextManager[Any]:
        import torch

        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.variant.precision)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dtype)

    def _apply_matmul_precision(self) -> None:
        # kiln's precisions: fp32 means TF32 off, tf32 means on (process-wide torch flags); bf16
        # and fp16 are autocast around each call and leave the flags alone.
        import torch

        if self.device.type == "cuda" and self.variant.precision in ("fp32", "tf32"):
            on = self.variant.precision == "tf32"
            torch.backends.cuda.matmul.allow_tf32 = on
            torch.backends.cudnn.allow_tf32 = on

    def _sync(self) -> None:
        import torch

        if self.synchronize and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _run_eager(self, req: Request) -> Any:
        import torch

        with torch.no_grad(), self._precision():
            out = self.model(*req.args, **req.kwargs)
        self._sync()
        return out

    def _invoke(self, req: Request, strict: bool) -> Any:
        import torch

        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            stack.enter_context(self._precision())
            if strict:
                stack.enter_context(STRICT.on(self.guard))
            else:
                stack.enter_context(compile_settings(self.grid.count))
            self.backend.before_step()
            return self._compiled(*req.args, **req.kwargs)

    def _run_bucket(self, key: tuple[int, ...], sizes: dict[str, int], req: Request) -> Any:
        self._ensure_outputs()
        padded = self.spec.pad(req, dict(zip(self.grid.symbols, key, strict=True)), self.pad_values)
        self.spec.mark_dynamic(padded, self._shared)
        try:
            out = self._invoke(padded, strict=self._warm)
        except RuntimeError as exc:  # dynamo's RecompileError is a RuntimeError too
            if not (self._warm and is_recompile_error(exc)):
                raise
            return self._run_eager(req), str(exc).splitlines()[0]
        out = self._slicer.slice(out, sizes)
        self._sync()
        return out, None

    def _ensure_outputs(self) -> None:
        """Learn, once, which output dims to slice (eager dry runs; see OutputSlicer)."""
        if self._slicer.by_leaf is not None:
            return
        import torch

        ref = self.spec.reference

        def run(sizes: Mapping[str, int]) -> Any:
            with torch.no_grad(), self._precision():
                return self.model(*(r := self.spec.resize(ref, sizes)).args, **r.kwargs)

        if self._slicer.declared:
            self._slicer.resolve(run(self.spec.sizes(ref)))
            return
        big = self.grid.largest()
        small = {}
        for s, b in self.grid.sizes.items():
            # Two different sizes per symbol, so a dim that follows it shows up as following it.
            small[s] = b[0] if b[0] != b[-1] else max(1, b[-1] - 1)
        self._slicer.infer(run, small, big)

    def _warmup_all(self) -> dict[str, Any]:
        ref = self.spec.reference
        t0, c0 = time.perf_counter(), compile_count()
        self._ensure_outputs()
        # Largest first: a shared (dynamic) graph is then compiled for sizes > 1 before any
        # size-1 bucket gets its own specialisation.
        keys = sorted(self.grid.keys(), reverse=True)
        # CUDA-graph trees warm a graph on its first call, record on the second, replay after.
        calls = 3 if self.device.type == "cuda" else 1
        for j, key in enumerate(keys):
            req = self.spec.resize(ref, dict(zip(self.grid.symbols, key, strict=True)))
            self.spec.mark_dynamic(req, self._shared)
            for _ in range(calls):
                self._invoke(req, strict=False)
            if self._on_warm_bucket is not None:
                self._sync()  # the bucket's work done, not queued, when it is reported
                self._on_warm_bucket(j + 1, len(keys))
        self._sync()
        compile_s, compilations = time.perf_counter() - t0, compile_count() - c0
        unstable = {}
        for key in keys:
            req = self.spec.resize(ref, dict(zip(self.grid.symbols, key, strict=True)))
            try:
                self._invoke(req, strict=True)
            except RuntimeError as exc:
                if not is_recompile_error(exc):
                    raise
                unstable[self.grid.label(key)] = str(exc).splitlines()[0]
        self._sync()
        if unstable:
            warnings.warn(
                f"{len(unstable)} bucket(s) still recompile after warm-up and will run eagerly: "
                f"{unstable}",
                RuntimeWarning,
                stacklevel=2,
            )
        self._warm = True
        self._warmup_info = {
            "buckets": len(keys),
            "seconds": time.perf_counter() - t0,
            "compile_seconds": compile_s,
            "compilations": compilations,
            "unstable_buckets": unstable,
        }
        return dict(self._warmup_info)


def _as_request(example: Mapping[str, Any] | Sequence[Any] | Any) -> Request:
    if isinstance(example, Mapping):
        return Request((), dict(example))
    if isinstance(example, (tuple, list)):
        return Request(tuple(example), {})
    return Request((example,), {})
