"""Fixed costs of a tune, paid once per workload: the reference outputs of the correctness check
(fp64 eager's outputs, and eager's error against them at the variant's precision and layout) and
the FLOP count, kept under ``<run dir>/fixed/`` by the first trial that computes them (a tune's
baseline computes those of the search's precisions ahead: references.prepay) and read by the
later trials of the same run directory; a trial that needs a value another is computing waits
for it.

None depends on the variant beyond its precision and layout: the references are plain eager on
the unmodified model (a remedied arm's rewritten copy is loaded with the original's weights and
inputs, so its references are the same), and the FLOPs are counted on eager at the variant's
precision and layout. A stored value is keyed by everything that decides it: the workload (its
spec, preset, batch size, step, seed, and the contents of its source file), a digest of the
example inputs, the device and its name, the host, the thread count, kiln and torch versions
and the environment variables that change what torch computes. Any difference, a file that
cannot be read, or a file whose own key differs from the trial's, and the value is computed
again (the trial's ``notes`` say why for the last two). A workload whose code kiln cannot
find, and an in-memory model (its bytes are not part of the key), never share.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pickle
import platform
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from torchkiln.runner.protocol.trial import TrialSpec
from torchkiln.runner.store.reuse import UNKNOWN, _installed, settings_env, workload_digest

FIXED_DIR = "fixed"
# Set per trial by the launcher (its compile cache, its lock, its GPU pin, its clock); none of
# them changes what eager computes, and keying by them would keep every trial apart.
PER_TRIAL_ENV = (
    "KILN_LAUNCHED_AT",
    "KILN_HOST_LOCK",
    "KILN_HOST_TURNS",
    "KILN_LAUNCHER_PID",
    "KILN_COMPILE_WORKERS",
    "KILN_WARM_START",
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
    "CUDA_VISIBLE_DEVICES",
)
IN_MEMORY_SPEC = "torchkiln.tune.inmemory:load"


def fixed_dir_for(trial_dir: str | Path) -> Path | None:
    """``<run dir>/fixed`` for a trial kept in ``<run dir>/trials/<id>``; None for a trial
    directory outside a run directory (nothing to share with)."""
    trial_dir = Path(trial_dir)
    if trial_dir.parent.name != "trials":
        return None
    return trial_dir.parent.parent / FIXED_DIR


def inputs_digest(inputs: Any) -> str:
    """sha256 over the example inputs' dtypes, shapes and bytes (in their nesting order)."""
    import torch

    from torchkiln.measure.correctness import flatten_tensors

    h = hashlib.sha256()
    for name, t in flatten_tensors(inputs, "in"):
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def workload_key(
    spec: TrialSpec, device_name: str | None, inputs: Any, env: dict[str, str] | None = None
) -> dict[str, Any] | None:
    """What every fixed cost of ``spec``'s workload depends on; None where sharing is unsafe.
    ``env``: the settings the trial was launched with (default: this process's now)."""
    import torch

    if spec.workload == IN_MEMORY_SPEC:
        return None
    source = workload_digest(spec.workload)
    if source == UNKNOWN:
        return None
    launched = settings_env() if env is None else env
    env = {k: v for k, v in launched.items() if k not in PER_TRIAL_ENV}
    return {
        "workload": spec.workload,
        "workload_file": source,
        "preset": spec.preset,
        "batch_size": spec.batch_size,
        "step": spec.step,
        "seed": spec.seed,
        "inputs": inputs_digest(inputs),
        "device": spec.device,
        "device_name": device_name,
        "host": platform.node(),
        "threads": torch.get_num_threads(),
        "cudnn_benchmark": spec.cudnn_benchmark,
        "torch_version": str(torch.__version__),
        **_installed(),
        "env": env,
    }


def _file_name(name: str, extra: dict[str, Any]) -> str:
    """One file per value: ``flops-bf16-channels_last=True.pt``, say."""
    parts = [name] + [f"{k}={v}" for k, v in sorted(extra.items())]
    return "-".join(parts).replace("/", "_")


class FixedStore:
    """One trial's view of the run directory's fixed costs; ``record()`` is what it reused and
    what it computed (and stored), by name."""

    def __init__(self, root: Path | None, key: dict[str, Any] | None) -> None:
        # Plain JSON values: what torch.load(weights_only=True) reads back, compared as equal.
        self.key = json.loads(json.dumps(key, sort_keys=True)) if key is not None else None
        self.dir = None
        if root is not None and key is not None:
            digest = hashlib.sha256(json.dumps(self.key, sort_keys=True).encode()).hexdigest()
            self.dir = Path(root) / digest[:16]
        self.reused: list[str] = []
        self.computed: list[str] = []
        self.notes: list[str] = []

    @property
    def shared(self) -> bool:
        return self.dir is not None

    def get_or_compute(self, name: str, extra: dict[str, Any], compute: Callable[[], Any]) -> Any:
        """The value stored as ``name`` for this key plus ``extra`` (what else it depends on:
        the precision, dropout), else ``compute()``'s, stored for the next trial. A trial in
        flight that is computing the same value is waited for, then its value read: trials
        that reached their checks together on an H200 host each computed GPT-2's references
        and FLOPs at bf16 (1.5-1.9 s of FLOP counting apiece, commit dc32300)."""
        if self.dir is None:
            self.computed.append(name)
            return compute()
        key = {**(self.key or {}), **extra}
        file = _file_name(name, extra)
        with self._computing(file):
            found = self._load(file, key)
            if found is not None:
                self.reused.append(name)
                return found[0]
            value = compute()
            self.computed.append(name)
            self._save(file, key, value)
        return value

    @contextlib.contextmanager
    def _computing(self, name: str) -> Iterator[None]:
        """Held while this process reads or computes ``name``: one computes, the others wait.
        An flock, so a trial that dies holding it (crash, timeout) releases it."""
        assert self.dir is not None
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _path(self, name: str) -> Path:
        assert self.dir is not None
        return self.dir / f"{name}.pt"

    def _load(self, name: str, key: dict[str, Any]) -> tuple[Any] | None:
        import torch

        path = self._path(name)
        if not path.exists():
            return None
        try:
            # Mapped, not read whole: GPT-2 small's fp64 logits at 8 x 512 are 1.6 GB, which a
            # trial reads through once, in its comparison (loading them and taking the largest
            # error of an fp32 output on a 2-core CPU host, torch 2.14.1: 4.1-5.8 s mapped,
            # 13.0-14.0 s read whole).
            data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            if not isinstance(data, dict) or "key" not in data or "value" not in data:
                raise ValueError("not a stored fixed cost (no key or value)")
        except (
            OSError,
            RuntimeError,
            ValueError,
            EOFError,
            TypeError,
            pickle.UnpicklingError,
        ) as exc:
            self.notes.append(f"the stored {name} ({path}) was unreadable ({exc}); recomputed")
            return None
        if data["key"] != key:
            self.notes.append(f"the stored {name} ({path}) was made for another key; recomputed")
            return None
        return (data["value"],)

    def _save(self, name: str, key: dict[str, Any], value: Any) -> None:
        import torch

        path = self._path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Whole or not at all: trials in flight together may read it while it is written.
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        torch.save({"key": key, "value": value}, tmp)
        os.replace(tmp, path)

    def record(self) -> dict[str, list[str]]:
        return {"reused": list(self.reused), "computed": list(self.computed)}
