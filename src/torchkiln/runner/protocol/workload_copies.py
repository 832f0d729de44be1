"""One build of the workload per trial process; every further arm gets a copy of it.

A trial builds its workload three to five times (the baseline instances, the variant, the
references of the correctness check, the FLOP count), each from the same seed, so each build
makes the same weights and inputs. Building a transformer means initialising every weight at
random on the host: GPT-2 small took 1.7-4.9 s a build in a trial on an H200 host (the `setup`,
`build` and `baseline` phases of a tune's trials, 16 host cores shared by four trials). A copy
of a kept build costs a memory copy.

A copy is what the factory would have returned: the same tensors (a deep copy, nothing shared
with another arm) and the random generators' states as the factory left them (Python's, NumPy's
and torch's: the host's, and every CUDA device's once CUDA is initialised), so whatever runs
after the build draws the same numbers. An arm that runs on a GPU gets its model weights and
inputs copied there directly (``load(..., device)``), not copied on the host first. Only a
workload whose tensors all live on the host is kept (a kept copy on a GPU would count in the
trial's memory), and only one of at most ``MAX_KEPT_BYTES``; anything else, or a workload that
cannot be deep-copied, is built anew each time. ``KILN_BUILD_ONCE=0`` builds anew each time.

A trial forked from the warm-start server finds a built-in workload already built there, once
for the whole tune (warm_server.prebuild), and copies that: its factory never runs in the trial
(``builds.built_by_server``). Only a trial process keeps a build (the worker calls
``activate``): it measures one workload and ends. A process that builds arms for several tunes
(an in-memory model tuned in the caller's process, a test) builds anew each time, since its next
workload may share a spec string with the last and not its model."""

from __future__ import annotations

import copy
import os
import random
from collections.abc import Callable, Hashable
from typing import Any

BUILD_ONCE_ENV = "KILN_BUILD_ONCE"
# Larger workloads are rebuilt: a kept copy doubles what the trial holds on the host.
MAX_KEPT_BYTES = 4 << 30

_active = False
_kept: dict[Hashable, tuple[Any, dict[str, Any]]] = {}
# How this process's builds went: "built" (the factory ran), "copied" (from the kept build).
counts = {"built": 0, "copied": 0}
# Why a workload was not kept, once per key (the trial's notes say it).
not_kept: dict[Hashable, str] = {}


def enabled() -> bool:
    return os.environ.get(BUILD_ONCE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


# Keys kept before this process became a trial's: built by the warm-start server it was forked
# from (warm_server.prebuild).
_inherited: set[Hashable] = set()


def activate() -> None:
    """This process is one trial's: keep its workload's first build for the arms after it.
    What a server it was forked from kept stays kept; the counts start from nothing."""
    global _active
    _active = True
    _inherited.update(_kept)
    counts.update(built=0, copied=0)


def rng_states() -> dict[str, Any]:
    import torch

    states: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        states["numpy"] = np.random.get_state()
    except ImportError:
        pass
    # Not torch.cuda.is_available(): it counts devices, and a process that has counted them
    # marks every child it forks later as unable to use CUDA (the warm-start server builds
    # workloads through here, then forks trials that must).
    if torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    import torch

    random.setstate(states["python"])
    torch.set_rng_state(states["torch"])
    if "numpy" in states:
        import numpy as np

        np.random.set_state(states["numpy"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])


def _tensors(obj: Any, seen: set[int]) -> list[Any]:
    """Every tensor the workload holds: its model's parameters and buffers, and the tensors in
    its inputs and targets."""
    import torch

    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, torch.nn.Module):
        return [*obj.parameters(), *obj.buffers()]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v, seen)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v, seen)]
    return []


def why_not_kept(workload: Any) -> str | None:
    """None when the workload may be kept and copied, else why not."""
    parts = [getattr(workload, k, None) for k in ("model", "example_inputs", "targets")]
    tensors = _tensors(parts, set())
    if any(t.device.type != "cpu" for t in tensors):
        return "its factory puts tensors on a device (a kept copy would count in its memory)"
    size = sum(t.numel() * t.element_size() for t in tensors)
    if size > MAX_KEPT_BYTES:
        return f"it holds {size / (1 << 30):.1f} GiB (over {MAX_KEPT_BYTES >> 30} GiB)"
    return None


def _copy_onto(workload: Any, device: str) -> Any:
    """A deep copy of ``workload`` whose model weights and inputs are made on ``device`` straight
    from the kept build's: no copy on the host first. A host copy of GPT-2 small (500 MB) took
    0.23-3.1 s on a 2-core CPU host, the slow ones faulting in fresh pages, and a trial makes
    three; its `setup` and `build` took 0.7-0.8 s each on an H100 host alone and 2.4-3.2 s
    beside seven other trials (GPT-2 tune, `tune_speed/h100/tune8-gpt2-results.json`). The
    copy is what moving a host copy would give: parameters stay parameters (tied ones tied),
    each tensor keeps its strides and whether it requires grad. Tensor subclasses, sparse and
    quantized tensors are copied on the host, as before a move."""
    import torch

    parts = [getattr(workload, k, None) for k in ("model", "example_inputs", "targets")]
    memo: dict[int, Any] = {}
    for t in _tensors(parts, set()):
        plain = type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided
        if not plain or t.is_quantized:
            continue
        moved = t.detach().to(device, copy=True)
        if isinstance(t, torch.nn.Parameter):
            memo[id(t)] = torch.nn.Parameter(moved, requires_grad=t.requires_grad)
        else:
            memo[id(t)] = moved.requires_grad_(t.requires_grad)
    return copy.deepcopy(workload, memo)


def load(key: Hashable, build: Callable[[], Any], device: str | None = None) -> Any:
    """The workload ``build`` makes (the caller has seeded the generators): the first time by
    calling it, later as a copy of that first build with the generators where it left them.
    ``device``: where the caller will move the model and inputs; a copy is made there directly
    (the first build is returned as built, on the host)."""
    if not (_active and enabled()):
        counts["built"] += 1
        return build()
    kept = _kept.get(key)
    if kept is not None:
        workload, states = kept
        on_host = device is None or device == "cpu"
        copied = copy.deepcopy(workload) if on_host else _copy_onto(workload, device)
        set_rng_states(states)
        counts["copied"] += 1
        return copied
    workload = build()
    counts["built"] += 1
    if key in not_kept:
        return workload
    why = why_not_kept(workload)
    if why is None:
        states = rng_states()
        try:
            kept_copy = copy.deepcopy(workload)
        except (TypeError, RuntimeError, copy.Error, AttributeError) as exc:
            why = f"it cannot be deep-copied ({type(exc).__name__}: {exc})"[:300]
        else:
            set_rng_states(states)  # a deep copy draws no numbers; made sure of all the same
            _kept[key] = (kept_copy, states)
    if why is not None:
        not_kept[key] = why
    return workload


def record() -> dict[str, Any]:
    """For the trial's result: how its builds went, and why a workload was built each time."""
    out: dict[str, Any] = dict(counts)
    if _inherited:
        out["built_by_server"] = True
    if not_kept:
        out["rebuilt_because"] = sorted(set(not_kept.values()))
    return out


def forget() -> None:
    """Back to a process that keeps nothing (tests)."""
    global _active
    _active = False
    _kept.clear()
    _inherited.clear()
    not_kept.clear()
    counts.update(built=0, copied=0)
