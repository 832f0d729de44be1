"""Where trials run: one interface, three ways.

An executor takes trial specs and a ``run_one(spec, gpu) -> result`` function (which runs the
trial in its own process, as ``launch.run_trial`` does) and hands each result to ``on_result``
as soon as it finishes, so the caller can write it into the run directory at once: a run that
dies loses only the trials still running. Results come back in spec order as well.

- ``LocalExecutor``: one trial after another (the default).
- ``PoolExecutor``: one trial per slot at once; a slot is a GPU index, pinned with
  CUDA_VISIBLE_DEVICES by ``run_one``. With several slots the trials take turns on one lock
  file (``host_lock``, passed to ``run_one``): no trial times its reps while another is busy.
- ``RayExecutor``: one Ray task per trial (``num_gpus=1`` on GPU machines); Ray is an extra.

``stream`` is the pool for a caller that decides what to run next from what has finished (the
tune's search): a slot that frees takes the next trial at once.

A ``run_one`` that raises, or a Ray worker that dies, turns into a ``crashed`` result for that
trial alone; the others go on."""

from __future__ import annotations

import importlib.util
import os
import tempfile
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from torchkiln.errors import KilnUserError, MissingExtraError, require
from torchkiln.runner.launch.host_lock import host_turns, remove_lock_files
from torchkiln.runner.launch.orphan import stop_trials, trials_may_run
from torchkiln.runner.protocol.trial import TrialSpec, base_result

# run_one(spec, gpu) or, from a pool of several slots, run_one(spec, gpu, host_lock=PATH).
RunOne = Callable[..., dict[str, Any]]
OnEvent = Callable[[TrialSpec, dict[str, Any]], None]
OnStart = Callable[[TrialSpec], None]

EXECUTORS = ("local", "pool", "ray")


def lost_result(spec: TrialSpec, reason: str, detail: str = "") -> dict[str, Any]:
    """The result of a trial whose worker was lost: it was not measured, and says why."""
    result = base_result(spec, "crashed", reason)
    result["phase"] = "start"
    if detail:
        result["traceback"] = detail[-8000:]
    return result


class TrialExecutor:
    """Runs trials; ``run`` returns their results in spec order and streams each to
    ``on_result`` (called in the caller's thread) as it finishes."""

    name = ""

    def run(
        self,
        specs: Sequence[TrialSpec],
        run_one: RunOne,
        *,
        on_start: OnStart | None = None,
        on_result: OnEvent | None = None,
    ) -> list[dict[str, Any]]:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}


def _call(
    run_one: RunOne, spec: TrialSpec, gpu: int | None, host_lock: str | None = None
) -> dict[str, Any]:
    """``run_one`` already turns a trial's crash into a status; a failure of ``run_one`` itself
    (a full disk, a bug) must not take the other trials down, so it becomes one too.
    ``host_lock`` (a pool's) is passed on only when there is one."""
    try:
        return run_one(spec, gpu) if host_lock is None else run_one(spec, gpu, host_lock=host_lock)
    except Exception as exc:  # noqa: BLE001  (every failure becomes a reported status)
        return lost_result(
            spec,
            f"the executor could not run the trial: {type(exc).__name__}: {exc}",
            traceback.format_exc(),
        )


class LocalExecutor(TrialExecutor):
    """One trial at a time, in order, in this machine's processes."""

    name = "local"

    def __init__(self, gpu: int | None = None) -> None:
        self.gpu = gpu

    def run(self, specs, run_one, *, on_start=None, on_result=None):
        results = []
        for spec in specs:
            if on_start:
                on_start(spec)
            result = _call(run_one, spec, self.gpu)
            if on_result:
                on_result(spec, result)
            results.append(result)
        return results


def visible_gpus() -> list[int]:
    """GPU indices this process may use: CUDA_VISIBLE_DEVICES's entries, or every device."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        entries = [e.strip() for e in env.split(",") if e.strip()]
        if not all(e.isdigit() for e in entries):
            raise KilnUserError(
                f"CUDA_VISIBLE_DEVICES={env!r}: the pool executor needs integer indices"
            )
        return [int(e) for e in entries]
    import torch

    return list(range(torch.cuda.device_count()))


class PoolExecutor(TrialExecutor):
    """As many trials at once as there are slots; each slot (a GPU index, or None for a CPU
    slot) runs one trial at a time, so no two trials share a GPU and time each other. With
    several slots they also take turns on the host (host_lock.py): a trial's timed reps wait
    until no other trial is working."""

    name = "pool"

    def __init__(self, slots: Sequence[int | None] | None = None) -> None:
        if slots is None:
            slots = visible_gpus()
            if not slots:
                raise KilnUserError(
                    "--executor pool runs one trial per visible GPU and there is none; "
                    "use --executor local (trials sharing CPU cores would time each other)"
                )
        if not slots:
            raise ValueError("a pool needs at least one slot")
        self.slots = list(slots)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "slots": self.slots}

    def run(self, specs, run_one, *, on_start=None, on_result=None):
        results: list[dict[str, Any] | None] = [None] * len(specs)
        queue = list(enumerate(specs))

        def next_trial() -> tuple[int, TrialSpec] | None:
            if not queue:
                return None
            i, spec = queue.pop(0)
            if on_start:
                on_start(spec)
            return i, spec

        def done(i: int, result: dict[str, Any]) -> None:
            results[i] = result
            if on_result:
                on_result(specs[i], result)

        stream(self.slots, next_trial, run_one, done)
        return [r for r in results if r is not None]


def host_lock_file() -> str:
    """A fresh lock file for trials taking turns on this host (host_lock.py); the caller
    removes it and its turnstile (host_lock.remove_lock_files)."""
    fd, path = tempfile.mkstemp(prefix="kiln-host-", suffix=".lock")
    os.close(fd)
    return path


def stream(
    slots: Sequence[int | None],
    next_trial: Callable[[], tuple[Any, TrialSpec] | None],
    run_one: RunOne,
    on_done: Callable[[Any, dict[str, Any]], None],
    *,
    host_lock: str | None = None,
    until: Future | None = None,
) -> None:
    """Keeps every slot busy with trials chosen one at a time: whenever a slot is free,
    ``next_trial()`` gives ``(tag, spec)`` or None (nothing to start now); each result goes to
    ``on_done(tag, result)`` in this thread as soon as its trial ends, and may give
    ``next_trial`` more to start. Unlike a pool over a fixed list, what runs next can depend on
    what has finished, and no slot waits for a slower neighbour (a search in batches of one
    trial per GPU left a GPU idle 41 s of a 129 s batch on two H200s, commit 94c62e6). With one
    slot the trials run in this thread, one after another; with several they take turns on the
    host (host_lock.py), on ``host_lock`` when given (the caller's, which it removes), else on
    a fresh file.

    ``until``: work running beside the trials (a tune's diagnosis) whose end may give
    ``next_trial`` more to start; the stream ends only once it is done, and its end wakes the
    stream as a trial's does. Its result is the caller's to read."""
    if len(slots) < 2 and until is None:
        while (item := next_trial()) is not None:
            on_done(item[0], _call(run_one, item[1], slots[0] if slots else None))
        return
    # Several kiln processes on this host (KILN_HOST_TURNS) share one turns file: this search's
    # trials then take turns with the others' too, not only among themselves.
    given = host_lock or host_turns()
    lock = given or host_lock_file()
    free = list(slots)
    running: dict[Future, tuple[Any, int | None]] = {}
    stopped = False
    try:
        with ThreadPoolExecutor(max_workers=len(slots)) as pool:
            try:
                while True:
                    # Read before asking for trials: an `until` that ends meanwhile wakes the
                    # wait below at once, and next_trial is asked again.
                    beside = [] if until is None or until.done() else [until]
                    while free and (item := next_trial()) is not None:
                        slot = free.pop(0)
                        fut = pool.submit(_call, run_one, item[1], slot, lock)
                        running[fut] = (item[0], slot)
                    if not running and not beside:
                        return
                    done, _ = wait([*running, *beside], return_when=FIRST_COMPLETED)
                    for fut in done:
                        if fut is until:
                            continue
                        tag, slot = running.pop(fut)
                        free.append(slot)
                        on_done(tag, fut.result())  # _call never raises an Exception
            except BaseException:
                # A Ctrl-C (or a failure here): the pool's shutdown below waits for its
                # threads, so their trials are ended now rather than run to their end.
                stopped = True
                stop_trials()
                raise
    finally:
        if stopped:
            trials_may_run()
        if given is None:
            remove_lock_files(lock)


def _ray_trial(run_one: RunOne, spec: TrialSpec) -> dict[str, Any]:
    """The Ray task: Ray has already pinned the task's GPU in CUDA_VISIBLE_DEVICES."""
    result = _call(run_one, spec, None)
    result.setdefault("notes", []).append(f"ran on Ray node {os.uname().nodename}")
    return result


@dataclass
class RayExecutor(TrialExecutor):
    """One Ray task per trial. ``address`` joins a running cluster ("auto", "ray://host:port");
    None starts a local one. ``gpus_per_trial`` is 1 on GPU machines (Ray then sets the task's
    CUDA_VISIBLE_DEVICES). A task whose worker dies is retried ``retries`` times by Ray, then
    reported as ``crashed``; the other tasks are unaffected."""

    address: str | None = None
    gpus_per_trial: float = 0
    retries: int = 1
    num_cpus: int | None = None  # for a local cluster only

    name = "ray"

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "address": self.address,
            "gpus_per_trial": self.gpus_per_trial,
            "retries": self.retries,
        }

    def _connect(self) -> tuple[Any, bool]:
        ray = require("ray", "ray", "--executor ray")
        if ray.is_initialized():
            return ray, False
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if self.address:
            kwargs["address"] = self.address
        elif self.num_cpus:
            kwargs["num_cpus"] = self.num_cpus
        try:
            ray.init(**kwargs)
        except ConnectionError as exc:
            raise KilnUserError(f"--address {self.address!r}: cannot reach Ray: {exc}") from exc
        return ray, True

    def run(self, specs, run_one, *, on_start=None, on_result=None):
        ray, started = self._connect()
        try:
            task = ray.remote(num_cpus=1, num_gpus=self.gpus_per_trial, max_retries=self.retries)(
                _ray_trial
            )
            refs = {}
            for i, spec in enumerate(specs):
                if on_start:
                    on_start(spec)
                refs[task.remote(run_one, spec)] = i
            results: list[dict[str, Any] | None] = [None] * len(specs)
            pending = list(refs)
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    i = refs[ref]
                    try:
                        result = ray.get(ref)
                    except ray.exceptions.RayError as exc:
                        result = lost_result(
                            specs[i],
                            f"the Ray worker running the trial was lost after "
                            f"{self.retries + 1} attempt(s): {type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else ''}",
                            str(exc),
                        )
                    results[i] = result
                    if on_result:
                        on_result(specs[i], result)
            return [r for r in results if r is not None]
        finally:
            if started:
                ray.shutdown()


def make_executor(name: str, *, device: str = "cpu", address: str | None = None):
    """The executor the CLI's ``--executor`` names."""
    if name not in EXECUTORS:
        raise KilnUserError(f"--executor {name!r}; choose from {list(EXECUTORS)}")
    if address and name != "ray":
        raise KilnUserError("--address is for --executor ray")
    if name == "local":
        return LocalExecutor()
    if name == "pool":
        return PoolExecutor()
    if importlib.util.find_spec("ray") is None:  # say so now, not after the preflight
        raise MissingExtraError("ray", "ray", "--executor ray")
    return RayExecutor(address=address, gpus_per_trial=1 if device.startswith("cuda") else 0)
