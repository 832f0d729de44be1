"""The build process: ``python -m torchkiln.ship.build JOB.json RESULT.json``.

In a fresh process with an empty compile cache, it builds the workload, applies the pick,
warms it on every shape it serves, and saves what the compiler made: Mega-Cache bytes
(`torch.compiler.save_cache_artifacts`), the kernels Inductor compiled (the C++ or Triton
binaries its cache entries point to: on the CPU, Mega-Cache alone left 44 s of a 48 s first
call, a tiny MLP on 2 shared cores, torch 2.14.1; with the kernels too, 11 s), and, for
inference, the forward compiled ahead of time (`torch.compile(...).aot_compile`) and, where
torch.export succeeds, an AOTInductor package."""

from __future__ import annotations

import sys
import tarfile
import time
from pathlib import Path
from typing import Any

CACHE_FILE = "artifacts/compile-cache.bin"
KERNELS_FILE = "artifacts/inductor-kernels.tar"
AOTI_FILE = "artifacts/model.pt2"
PRECOMPILED_FILE = "artifacts/precompiled.tar"
MAX_SHAPES = 8  # distinct input shapes taken from a workload's stream
# Left out of the kernels archive: graph-level entries Mega-Cache carries already, and locks.
NOT_KERNELS = {"fxgraph", "aotautograd", "locks", "pgo"}


def shapes_of(inputs: Any) -> list[list[int]]:
    from torchkiln.ship.export import _leaves

    return [list(getattr(t, "shape", ())) for t in _leaves(inputs)]


def served_inputs(workload: Any, device: str) -> list[Any]:
    """The example inputs, then each new shape the workload's stream brings (at most
    MAX_SHAPES in all), moved to ``device``."""
    from torchkiln.runner.protocol.settings import map_tensors

    found = [workload.example_inputs]
    seen = [shapes_of(workload.example_inputs)]
    if workload.input_stream is not None and workload.step == "infer":
        for batch in workload.input_stream():
            batch = batch if isinstance(batch, (tuple, list, dict)) else (batch,)
            if shapes_of(batch) not in seen:
                seen.append(shapes_of(batch))
                found.append(batch)
            if len(found) >= MAX_SHAPES:
                break
    return [map_tensors(b, lambda t: t.to(device)) for b in found]


def call(run: Any, inputs: Any) -> Any:
    return run(**inputs) if isinstance(inputs, dict) else run(*inputs)


def train_call(shipped: Any, workload: Any, inputs: Any, device: str) -> Any:
    """Forward, loss and backward: the graphs a training step compiles (the optimizer's step
    is the caller's code outside the compiled model)."""
    from torchkiln.runner.protocol.executable import default_loss
    from torchkiln.runner.protocol.settings import map_tensors

    targets = map_tensors(workload.targets, lambda t: t.to(device))
    # As a training loop's optimizer.zero_grad(set_to_none=True) does: under CUDA graphs the
    # last step's gradients live in the graph's memory pool, which this step's replay
    # overwrites, so accumulating into them fails.
    workload.model.zero_grad(set_to_none=True)
    with shipped._autocast():
        loss = (workload.loss_fn or default_loss)(call(shipped, inputs), targets)
    loss.backward()
    return loss.detach()


def workload_for(job: dict[str, Any]) -> Any:
    """The workload a ship directory is built and measured on, seeded as the tune's trials
    were: for a pick with remedies for graph breaks (``+fix=``), the tune's rewritten copy
    (`repair_plan`) with the unmodified model's weights and inputs, as the pick's trial ran it
    and as production runs it once the patch is applied."""
    from types import SimpleNamespace

    from torchkiln.repair import arm
    from torchkiln.runner.protocol.settings import seed_everything
    from torchkiln.variants import parse_variant
    from torchkiln.workloads import load_workload

    seed = job.get("seed", 0)
    kw = {"preset": job["preset"], "batch_size": job.get("batch_size"), "step": job["step"]}
    seed_everything(seed)
    spec = SimpleNamespace(extra={arm.PLAN_KEY: job.get("repair_plan")}, seed=seed, **kw)
    workload, _ = arm.load_for(
        spec, parse_variant(job["spec"]), lambda: load_workload(job["workload"], **kw)
    )
    return workload


def _archive_kernels(root: Path, dest: Path) -> bool:
    entries = (
        [p for p in sorted(root.iterdir()) if p.name not in NOT_KERNELS] if root.exists() else []
    )
    if not entries:
        return False
    with tarfile.open(dest, "w") as tar:
        for p in entries:
            tar.add(p, arcname=p.name)
    return True


def build(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    from torchkiln.repair.remedies import Remedies
    from torchkiln.ship import export
    from torchkiln.ship.load import Shipped
    from torchkiln.ship.manifest import environment, model_hash
    from torchkiln.tune.recommend import apply

    to, device, step = Path(job["to"]), job["device"], job["step"]
    (to / "artifacts").mkdir(parents=True, exist_ok=True)
    phases: dict[str, float] = {}
    t = time.perf_counter()
    wl = workload_for(job)
    model = wl.model.to(device)
    model.eval() if step == "infer" else model.train()
    hashes = model_hash(model)
    inputs = served_inputs(wl, device)
    phases["build_model_s"] = time.perf_counter() - t
    doc = {"spec": job["spec"], "device": device, "step": step, "fixes": job.get("fixes")}
    out: dict[str, Any] = {
        "environment": environment(device),
        "model_hash": hashes,
        "model_module": type(model).__module__,
        "shapes": [shapes_of(b) for b in inputs],
        "artifacts": {},
        "export": None,
        "phases": phases,
    }
    package = job.get("package", "auto")
    if package in ("auto", "cache"):
        t = time.perf_counter()
        shipped = Shipped(apply(model, job["spec"], device), doc, "build", "")
        for batch in inputs:
            if step == "infer":
                call(shipped, batch)
            else:
                train_call(shipped, wl, batch, device)
        phases["warm_s"] = time.perf_counter() - t
        save = getattr(torch.compiler, "save_cache_artifacts", None)
        saved = save() if save is not None else None
        if save is None:
            out["cache_note"] = f"torch {torch.__version__} has no Mega-Cache to save"
        elif saved is None:
            out["cache_note"] = "the compiler left nothing to save (nothing was compiled)"
        else:
            (to / CACHE_FILE).write_bytes(saved[0])
            out["artifacts"]["cache"] = {"file": CACHE_FILE}
    if package in ("auto", "precompiled"):
        if step != "infer":
            out["precompile"] = {
                "reason": "the ahead-of-time compiled function serves inference; a training "
                "step's backward is compiled on its first call",
                "remedy": "the compile-cache route serves training",
                "error": "",
            }
        else:
            from torchkiln.ship import precompiled

            t = time.perf_counter()
            got = precompiled.build(
                model,
                inputs,
                job["spec"],
                device,
                to / PRECOMPILED_FILE,
                Remedies.of(job.get("fixes")),
            )
            phases["precompile_s"] = time.perf_counter() - t
            if "functions" in got:
                out["artifacts"]["precompiled"] = {"file": PRECOMPILED_FILE, **got}
                out["precompile"] = None
            else:
                out["precompile"] = got
    if package in ("auto", "aoti"):
        if step != "infer":
            out["export"] = {
                "reason": "AOTInductor packages inference graphs; a training step is not one",
                "remedy": "the compile-cache route serves training",
                "error": "",
            }
        else:
            t = time.perf_counter()
            from torchkiln.runner.protocol.settings import autocast, map_tensors
            from torchkiln.ship.layout import to_layout
            from torchkiln.variants import parse_variant

            v = parse_variant(job["spec"])
            if v.channels_last:
                model = model.to(memory_format=torch.channels_last)
            first = map_tensors(inputs[0], lambda x: to_layout(x, v.channels_last))
            built, why = export.build_package(
                model,
                first,
                out["shapes"],
                to / AOTI_FILE,
                lambda: autocast(device, v.precision),
            )
            phases["aoti_s"] = time.perf_counter() - t
            if built is not None:
                out["artifacts"]["aoti"] = {"file": AOTI_FILE, **built}
            out["export"] = why
    # Last, so that it holds what every route compiled (the package's ISA probes included).
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    if out["artifacts"] and _archive_kernels(Path(cache_dir()), to / KERNELS_FILE):
        out["artifacts"]["kernels"] = {"file": KERNELS_FILE}
    return out


def main(argv: list[str]) -> int:
    from torchkiln.ship.child import child_main

    return child_main(argv, build)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
