"""Build an `xla` arm: the workload's model run through torchax as JAX functions under jax.jit.

Inference jits the forward that `torchax.extract_jax` gives; training jits the whole step:
forward, loss, backward (jax.value_and_grad) and the optax twin of the workload's optimizer.
The arm looks like `build_arm`'s to the trial: `step()` returns torch tensors (outputs, or the
loss), and `model.named_parameters()` gives the current weights, so the correctness check reads
it unchanged.

JAX runs on its own streams, which kiln's CUDA-event timers cannot see, so every step waits
for its result (`block_until_ready`). That costs one host round-trip per step (tens of µs),
small against the ms steps kiln measures, and is said in the trial's notes."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from torchkiln.errors import UnsupportedVariant, require
from torchkiln.runner.protocol.executable import Arm, default_loss, default_optimizer
from torchkiln.runner.protocol.settings import disable_dropout, seed_everything
from torchkiln.runner.protocol.trial import TrialSpec
from torchkiln.variants import Variant
from torchkiln.workloads import load_workload

# Distinct input shapes timed for the recompilation report (each one is a full XLA compile).
MAX_STREAM_SHAPES = 4

TIMING_NOTE = (
    "xla: each step waits for its result (block_until_ready), since JAX's streams are invisible "
    "to the CUDA-event timer"
)


def _import_jax(device: str) -> tuple[Any, Any]:
    """jax and torchax, with the process set up first: JAX must not grab most of the GPU up
    front (memory would not mean what it means for the other arms), and on a CPU trial JAX must
    not look for a GPU."""
    if "jax" not in sys.modules:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        if device == "cpu":
            os.environ.setdefault("JAX_PLATFORMS", "cpu")
    jax = require("jax", "xla", "the xla variant")
    torchax = require("torchax", "xla", "the xla variant")
    return jax, torchax


def jax_device(jax: Any, device: str) -> Any:
    kind, _, index = device.partition(":")
    platform = "gpu" if kind == "cuda" else "cpu"
    try:
        devices = jax.devices(platform)
    except RuntimeError as exc:
        raise UnsupportedVariant(
            f"JAX has no {platform} backend ({exc}); for CUDA install jax with its CUDA plugin"
        ) from exc
    return devices[int(index or 0)]


def unsupported_from(exc: BaseException) -> UnsupportedVariant | None:
    """What XLA cannot do, as `unsupported` with the reason: an operator torchax has no lowering
    for, or a value that must be concrete under jit (data-dependent shapes or control flow,
    e.g. `nonzero`, `unique`, `if x.sum() > 0`), naming the operator and the model's line."""
    import jax
    from torchax.tensor import OperatorNotFound

    if isinstance(exc, OperatorNotFound):
        return UnsupportedVariant(f"xla: torchax cannot lower an operator: {exc}{_where(exc)}")
    concrete = (jax.errors.ConcretizationTypeError, jax.errors.NonConcreteBooleanIndexError)
    if isinstance(exc, concrete):
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        # JAX's first line names the traced value; its second, when there is one, the cause
        # ("The size argument of jnp.nonzero must be statically specified ...").
        cause = lines[1] if len(lines) > 1 and not lines[1].startswith("The error") else ""
        return UnsupportedVariant(
            "xla: data-dependent shape or control flow cannot be traced by jax.jit"
            f"{_where(exc)} ({type(exc).__name__}: {lines[0] if lines else ''} {cause})".rstrip()
        )
    return None


def _where(exc: BaseException) -> str:
    """The aten operator torchax was lowering (its `_aten_<op>` function) and the innermost
    line of the user's code, from the traceback."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    op = next(
        (f.name[len("_aten_") :] for f in reversed(frames) if f.name.startswith("_aten_")), None
    )
    engine = ("site-packages", "dist-packages", "/torchkiln/", "<frozen")
    user = next((f for f in reversed(frames) if not any(e in f.filename for e in engine)), None)
    parts = []
    if op:
        parts.append(f"operator aten.{op}")
    if user:
        parts.append(f"at {user.filename}:{user.lineno} in {user.name}: {user.line}")
    return ": " + ", ".join(parts) if parts else ""


@contextlib.contextmanager
def numerics(jax: Any, torchax: Any, env: Any, precision: str) -> Iterator[None]:
    """The variant's precision inside the traced function. fp32 means full fp32 matmuls
    (XLA's GPU default would use TF32, unlike the eager fp32 arm); bf16/fp16 follow torch's
    autocast policy through torchax's twin of it."""
    import torch

    matmul = {"fp32": "highest", "tf32": "tensorfloat32"}.get(precision, "default")
    with jax.default_matmul_precision(matmul):
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        if dtype is None:
            yield
        else:
            with torchax.amp.autocast("jax", dtype=dtype, env=env):
                yield


def optax_twin(optimizer: Any) -> Any:
    """The optax transformation that updates weights as ``optimizer`` would (one param group)."""
    import torch

    optax = require("optax", "xla", "the xla variant's training step")
    if len(optimizer.param_groups) != 1:
        raise UnsupportedVariant(
            f"xla: {len(optimizer.param_groups)} optimizer param groups; only one is translated"
        )
    g = optimizer.param_groups[0]
    if type(optimizer) is torch.optim.SGD:
        if g.get("dampening", 0):
            raise UnsupportedVariant("xla: SGD with dampening has no optax twin here")
        tx = optax.sgd(g["lr"], momentum=g["momentum"] or None, nesterov=g["nesterov"])
        if g["weight_decay"]:
            tx = optax.chain(optax.add_decayed_weights(g["weight_decay"]), tx)
        return tx
    if type(optimizer) in (torch.optim.Adam, torch.optim.AdamW):
        b1, b2 = g["betas"]
        if type(optimizer) is torch.optim.AdamW:
            return optax.adamw(g["lr"], b1=b1, b2=b2, eps=g["eps"], weight_decay=g["weight_decay"])
        tx = optax.adam(g["lr"], b1=b1, b2=b2, eps=g["eps"])
        if g["weight_decay"]:
            tx = optax.chain(optax.add_decayed_weights(g["weight_decay"]), tx)
        return tx
    raise UnsupportedVariant(
        f"xla: no optax twin for {type(optimizer).__name__}; translated: SGD, Adam, AdamW"
    )


def to_torch(tree: Any) -> Any:
    """JAX arrays to torch tensors on the same device, zero-copy through DLPack."""
    import torch
    from torch.utils import _pytree as pytree

    return pytree.tree_map(lambda x: torch.from_dlpack(x) if hasattr(x, "__dlpack__") else x, tree)


def _split(inputs: Any) -> tuple[tuple, dict]:
    return ((), dict(inputs)) if isinstance(inputs, dict) else (tuple(inputs), {})


class ModelView:
    """Stands in for the torch model in the trial: `named_parameters()` gives the JAX weights
    of the latest step as torch tensors (host copies), everything else is the torch model's."""

    def __init__(self, model: Any, state: dict[str, Any]) -> None:
        self._model = model
        self._state = state

    def named_parameters(self) -> Iterator[tuple[str, Any]]:
        import numpy as np
        import torch

        params = self._state.get("params", {})
        for name, p in self._model.named_parameters():
            if name in params:
                value = torch.from_numpy(np.array(params[name]))
                yield name, value.requires_grad_(p.requires_grad)
            else:
                yield name, p

    def parameters(self) -> Iterator[Any]:
        return (p for _, p in self.named_parameters())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


@dataclass
class XlaArm(Arm):
    """An Arm whose step is one jitted JAX call; ``call`` runs it on other inputs (new shapes)."""

    jitted: Any = None
    call: _Runner | None = None
    jax_device: Any = None
    notes: list[str] = field(default_factory=list)

    def load_batch(self, batch: Any) -> None:
        new = batch if isinstance(batch, (tuple, list, dict)) else (batch,)
        self.inputs = self.call.put(new)  # type: ignore[union-attr]

    def report(self) -> dict[str, Any]:
        """JAX's own peak memory (its allocator is not torch's) and, where the workload's input
        stream varies, the compile each new shape costs."""
        stats = self.jax_device.memory_stats() or {}
        out: dict[str, Any] = {
            "jax_device": str(self.jax_device),
            "jax_peak_bytes_in_use": stats.get("peak_bytes_in_use"),
            "jax_bytes_limit": stats.get("bytes_limit"),
            "shape_recompiles": None,
            "notes": list(self.notes),
        }
        if not stats:
            out["notes"].append(f"JAX reports no memory statistics on {self.jax_device.platform}")
        out["shape_recompiles"] = self._stream_recompiles(out["notes"])
        return out

    def _stream_recompiles(self, notes: list[str]) -> list[dict[str, Any]] | None:
        stream = self.workload.input_stream
        if stream is None:
            return None
        if self.workload.step != "infer":
            notes.append("recompilation per shape is measured for inference (targets are fixed)")
            return None
        import jax

        seen = {_shapes(self.inputs)}
        rows = []
        for batch in stream():
            batch = batch if isinstance(batch, (tuple, list, dict)) else (batch,)
            shapes = _shapes(batch)
            if shapes in seen:
                continue
            seen.add(shapes)
            before = _cache_size(self.jitted)
            jax_in = self.call.put(batch)  # type: ignore[union-attr]
            t0 = time.perf_counter()
            try:
                jax.block_until_ready(self.call(jax_in))  # type: ignore[misc]
            except UnsupportedVariant as exc:
                # A shape jit cannot trace is a finding about that shape, not the trial's end.
                rows.append({"shapes": [list(s) for s in shapes], "unsupported": str(exc)})
                continue
            first = time.perf_counter() - t0
            t0 = time.perf_counter()
            jax.block_until_ready(self.call(jax_in))  # type: ignore[misc]
            again = time.perf_counter() - t0
            after = _cache_size(self.jitted)
            rows.append(
                {
                    "shapes": [list(s) for s in shapes],
                    "first_call_s": first,
                    "second_call_s": again,
                    "recompiled": None if before is None or after is None else after > before,
                }
            )
            if len(rows) >= MAX_STREAM_SHAPES:
                break
        return rows


def _shapes(inputs: Any) -> tuple:
    from torch.utils import _pytree as pytree

    return tuple(tuple(getattr(x, "shape", ())) for x in pytree.tree_leaves(inputs))


def _cache_size(jitted: Any) -> int | None:
    size = getattr(jitted, "_cache_size", None)
    return size() if callable(size) else None


class _Runner:
    """Calls a jitted function, turning what XLA cannot trace into `unsupported`."""

    def __init__(self, fn: Callable[..., Any], put: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.put = put

    def __call__(self, *args: Any) -> Any:
        try:
            return self.fn(*args)
        except Exception as exc:  # noqa: BLE001  (re-raised, classified when XLA can't do it)
            unsupported = unsupported_from(exc)
            if unsupported is not None:
                raise unsupported from exc
            raise


def build_xla_arm(
    spec: TrialSpec, variant: Variant, *, fp64: bool = False, no_dropout: bool = False
) -> XlaArm:
    """The twin of `build_arm` for the xla backend: same seed, same weights, same inputs."""
    from torch.utils import _pytree as pytree

    if fp64:
        raise ValueError("the fp64 reference is always eager")
    if variant.channels_last:
        raise UnsupportedVariant("xla: XLA picks its own layouts; +channels_last does not apply")
    if variant.precision == "fp16" and spec.step == "train":
        raise UnsupportedVariant("xla: fp16 training needs loss scaling; use +bf16")
    jax, torchax = _import_jax(spec.device)
    dev = jax_device(jax, spec.device)
    env = torchax.default_env()
    precision = variant.precision

    seed_everything(spec.seed)
    workload = load_workload(
        spec.workload, preset=spec.preset, batch_size=spec.batch_size, step=spec.step
    )
    model = workload.model  # stays a torch module on the host; its weights travel to JAX
    if no_dropout:
        disable_dropout(model)

    def put(tree: Any) -> Any:
        return jax.device_put(env.t2j_copy(tree), dev)

    def put_inputs(inputs: Any) -> Any:
        return put(_split(inputs))

    inputs = put_inputs(workload.example_inputs)
    treedef: dict[str, Any] = {}
    state: dict[str, Any] = {}

    if workload.step == "infer":
        model.eval()
        weights, forward = torchax.extract_jax(model)
        weights = jax.device_put(weights, dev)

        def infer(weights: Any, inputs: Any) -> list[Any]:
            args, kwargs = inputs
            with numerics(jax, torchax, env, precision):
                out = forward(weights, args, kwargs)
            # The output may be a torch-only pytree (a transformers ModelOutput): hand jax the
            # leaves and keep the structure to rebuild it on the torch side.
            leaves, treedef["out"] = pytree.tree_flatten(out)
            return leaves

        jitted = jax.jit(infer)
        call = _Runner(lambda inp: jitted(weights, inp), put_inputs)

        def step() -> Any:
            out = jax.block_until_ready(call(arm.inputs))
            return pytree.tree_unflatten(to_torch(out), treedef["out"])

    else:
        model.train()
        optax = require("optax", "xla", "the xla variant's training step")
        loss_fn = workload.loss_fn or default_loss
        tx = optax_twin((workload.make_optimizer or default_optimizer)(model))
        jm = torchax.interop.JittableModule(model)
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        params = {n: p for n, p in jm.params.items() if n in trainable}
        buffers = {**jm.buffers, **{n: p for n, p in jm.params.items() if n not in trainable}}
        targets = workload.targets

        def loss_of(params: Any, buffers: Any, inputs: Any, targets: Any, key: Any) -> Any:
            t_params, t_buffers, (args, kwargs), t_targets = env.j2t_iso(
                (params, buffers, inputs, targets)
            )
            with env, env.override_property(prng=key), numerics(jax, torchax, env, precision):
                out = jm.functional_call("forward", t_params, t_buffers, *args, **kwargs)
                loss = loss_fn(out, t_targets)
            # Buffers updated in place (batch-norm running statistics) come back as aux.
            return env.t2j_iso(loss), env.t2j_iso(t_buffers)

        def train_step(params, buffers, opt_state, key, inputs, targets):  # noqa: ANN001
            key, sub = jax.random.split(key)
            (loss, buffers), grads = jax.value_and_grad(loss_of, has_aux=True)(
                params, buffers, inputs, targets, sub
            )
            updates, opt_state = tx.update(grads, opt_state, params)
            return loss, optax.apply_updates(params, updates), buffers, opt_state, key

        # Donating the state on the CPU client only warns that it cannot; do not ask there.
        donate = (0, 1, 2, 3) if variant.backend.donate and dev.platform != "cpu" else ()
        jitted = jax.jit(train_step, donate_argnums=donate)
        state["params"] = put(params)
        state["buffers"] = put(buffers)
        state["opt_state"] = tx.init(state["params"])
        state["key"] = jax.device_put(jax.random.key(spec.seed), dev)
        jax_targets = put(targets)

        def run(inp: Any) -> Any:
            loss, state["params"], state["buffers"], state["opt_state"], state["key"] = jitted(
                state["params"],
                state["buffers"],
                state["opt_state"],
                state["key"],
                inp,
                jax_targets,
            )
            return loss, state["params"]

        call = _Runner(run, put_inputs)

        def step() -> Any:
            loss, _ = jax.block_until_ready(call(arm.inputs))
            return to_torch(loss)

    arm = XlaArm(
        variant=variant,
        workload=workload,
        model=ModelView(model, state),
        step=step,
        inputs=inputs,
        jitted=jitted,
        call=call,
        jax_device=dev,
        notes=[TIMING_NOTE],
    )
    return arm
