"""`kiln ship`: the tune's pick as a directory production can load, its routes measured.

ship DIR/
  __init__.py, pick.py   apply(model) -> the compiled model (the variant registry applies it)
  manifest.json          environment, spec, shapes, model hash, artifacts with sha256,
                         each route's first call and steady step, measured
  artifacts/             compile-cache.bin (Mega-Cache), inductor-kernels.tar,
                         precompiled.tar (the forward compiled ahead of time), model.pt2
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from torchkiln import __version__
from torchkiln.errors import KilnUserError
from torchkiln.repair.judge import PATCH_FILE
from torchkiln.repair.plan import PLAN_FILE
from torchkiln.ship import pairing
from torchkiln.ship.load import ARTIFACT_ROUTES
from torchkiln.ship.manifest import describe_artifact, write_manifest
from torchkiln.variants import parse_variant

PACKAGES = ("auto", "cache", "precompiled", "aoti")
BUILD_TIMEOUT_S = 1800.0
PROBE_TIMEOUT_S = 900.0
STEADY_SLACK = 0.02  # a route whose steady step is more than 2% slower than cold's goes last


def _spawn(module: str, job: dict[str, Any], work: Path, timeout_s: float) -> dict[str, Any]:
    """Runs ``module`` on ``job`` in a fresh process with its own empty compile caches, so each
    route's first call is measured from what the ship directory holds and nothing else."""
    proc = _launch(module, job, work)
    return _collect(proc, work, timeout_s)


def _launch(module: str, job: dict[str, Any], work: Path) -> subprocess.Popen:
    """``module`` started on ``job`` (see _spawn); _collect waits for its result."""
    from torchkiln.runner.launch import spawn
    from torchkiln.runner.launch.orphan import launcher_env

    work.mkdir(parents=True, exist_ok=True)
    job_path, result_path = work / "job.json", work / "result.json"
    result_path.unlink(missing_ok=True)
    job_path.write_text(json.dumps(job, indent=2))
    env = launcher_env(dict(os.environ))
    env["PYTHONUNBUFFERED"] = "1"
    env["TORCHINDUCTOR_CACHE_DIR"] = str(work / "cache" / "inductor")
    # Unset, Inductor keeps Triton's binaries in its own cache directory (triton/<device>), as
    # in a production process with default settings: the kernels archive then carries them.
    env.pop("TRITON_CACHE_DIR", None)
    cmd = [sys.executable, "-m", module, str(job_path), str(result_path)]
    with open(work / "stderr.txt", "wb") as err, open(work / "stdout.txt", "wb") as out:
        return spawn.start(cmd, env=env, stdout=out, stderr=err)


def _collect(proc: subprocess.Popen, work: Path, timeout_s: float) -> dict[str, Any]:
    """The result of a process _launch started, once it exits (killed after ``timeout_s``)."""
    from torchkiln.runner.launch import spawn

    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        spawn.kill_group(proc)
        return {"ok": False, "error": f"did not finish within {timeout_s:.0f} s"}
    except BaseException:
        spawn.kill_group(proc)
        raise
    result_path = work / "result.json"
    if not result_path.exists():
        return {
            "ok": False,
            "error": f"exited {proc.returncode} without a result: {_crash_text(work)}",
        }
    return json.loads(result_path.read_text())


def _crash_text(work: Path) -> str:
    """The end of a child's stderr; for a crash in native code, the Python stack faulthandler
    wrote (up to its list of extension modules, which says nothing of where it crashed)."""
    from torchkiln.runner.launch.trial_process import tail

    text = tail(work / "stderr.txt", 20000)
    at = text.rfind("Fatal Python error")
    if at < 0:
        return text[-600:]
    stack = text[at:].split("\nExtension modules:")[0]
    return stack[:3000]


def _writable(to: Path) -> None:
    try:
        to.mkdir(parents=True, exist_ok=True)
        probe = to / ".kiln-write-check"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise KilnUserError(f"--to {to}: cannot write there ({exc.strerror or exc})") from exc


PICK_MODULE = '''"""The pick of a kiln tune: {spec} ({step}, {device}).

`apply(model)` returns the model compiled with the pick's precision, layout and settings,
ready to call; `load(model)` also uses the compiled artifacts beside this file when they fit.
The same pick written out as plain PyTorch:

{code}
"""

from pathlib import Path

SPEC = {spec!r}
STEP = {step!r}
DEVICE = {device!r}


def apply(model):
    import torchkiln

    return torchkiln.load(Path(__file__).parent, model, route="cold")


def load(model):
    import torchkiln

    return torchkiln.load(Path(__file__).parent, model)
'''


def _write_module(
    to: Path, spec: str, step: str, device: str, fixes: dict[str, Any] | None = None
) -> None:
    from torchkiln.tune.recommend import code

    text = code(spec, step, device)
    if fixes:
        text += "\n\n# The pick's remedies for graph breaks, before the first call:\n"
        text += "\n".join((fixes.get("config") or {}).get("lines") or [])
        if fixes.get("code"):
            text += f"\n# and the model's source with {PATCH_FILE} (beside this file) applied"
    text = text.replace('"""', "'''")
    body = "\n".join("    " + line if line else "" for line in text.splitlines())
    (to / "pick.py").write_text(PICK_MODULE.format(spec=spec, step=step, device=device, code=body))
    (to / "__init__.py").write_text("from .pick import DEVICE, SPEC, STEP, apply, load  # noqa\n")


# How far a route's output may sit from the cold compile's, relative to the output's largest
# magnitude, by the pick's precision. Inductor's routes may order a reduction differently, and a
# process may get other cuBLAS algorithms: at fp32 1e-3 is far below any precision policy's error
# and far above a wrong kernel's. A 16-bit output rounds at 2**-8 (bf16) or 2**-11 (fp16) of its
# magnitude, so two such roundings apart is the same "equal": GPT-2 small's bf16 logits from the
# cache route were 0.023 from the cold compile's (H200, torch 2.11), 1.5 bf16 steps.
ROUTE_TOLERANCE = {"bf16": 2**-6, "fp16": 2**-9}
FP32_ROUTE_TOLERANCE = 1e-3


def _compare(a: Path, b: Path, precision: str = "fp32") -> dict[str, Any]:
    """How far a route's first output is from the cold compile's."""
    import torch

    from torchkiln.ship.export import _leaves

    xs = [t for t in _leaves(torch.load(a)) if isinstance(t, torch.Tensor)]
    ys = [t for t in _leaves(torch.load(b)) if isinstance(t, torch.Tensor)]
    if len(xs) != len(ys) or any(x.shape != y.shape for x, y in zip(xs, ys, strict=True)):
        return {"matches_cold": False, "max_abs_diff": None, "why": "outputs differ in shape"}
    diff = max(
        (float((x.float() - y.float()).abs().max()) for x, y in zip(xs, ys, strict=True)),
        default=0.0,
    )
    scale = max((float(y.float().abs().max()) for y in ys), default=0.0)
    tol = ROUTE_TOLERANCE.get(precision, FP32_ROUTE_TOLERANCE)
    return {"matches_cold": diff <= tol * max(scale, 1.0), "max_abs_diff": diff}


def _order(routes: dict[str, dict[str, Any]]) -> list[str]:
    """Artifact routes by first fast output, those slower per step than cold's (by more than
    STEADY_SLACK) or giving other outputs last; a route that failed is left out."""
    cold = routes.get("cold") or {}
    cold_ms = (cold.get("steady_ms") or {}).get("median")
    good, slow = [], []
    for name in ARTIFACT_ROUTES:
        r = routes.get(name)
        if not r or not r.get("ok") or r.get("route") != name or not r.get("matches_cold", True):
            continue
        pair = r.get("paired") or {}
        if pair.get("route_over_cold") is not None:
            # Timed rep by rep against the cold process, both alive (ship.pairing).
            is_slow = pair["route_over_cold"] > 1 + STEADY_SLACK
        else:
            # Apart, slower only when even its fastest rep is: the cache route runs the cold
            # compile's very kernels, yet its median step was 9% slower in its own process
            # (0.450 vs 0.414 ms, tiny MLP, a shared 2-core host, torch 2.14.1).
            fastest = min(r["steady_ms"].get("samples") or [r["steady_ms"]["median"]])
            is_slow = bool(cold_ms) and fastest > cold_ms * (1 + STEADY_SLACK)
        (slow if is_slow else good).append(name)
    key = lambda n: routes[n]["first_fast_s"]  # noqa: E731
    return sorted(good, key=key) + sorted(slow, key=key)


def measure_routes(
    to: Path,
    work: Path,
    routes: list[str],
    timeout_s: float = PROBE_TIMEOUT_S,
    precision: str = "fp32",
    rounds: int = 1,
    paired: bool = True,
) -> dict[str, dict[str, Any]]:
    """Each route (and the cold compile) in its own fresh process, its output beside cold's.
    With ``paired`` the first round's processes stay alive once measured, and each route's
    steady step is timed against the cold process's rep by rep (``paired``: ship.pairing).
    With ``rounds`` > 1 the processes are started that many times over, cold first in each
    round (cold, route, cold, route, ...), and each route keeps every round's first fast
    output and steady step (``rounds``) and its steady step over cold's of the same round
    (``steady_vs_cold``)."""
    got: dict[str, dict[str, Any]] = {}
    for i in range(rounds):
        if i == 0 and paired:
            got = _paired_round(to, work, routes, timeout_s)
        else:
            for name in ["cold", *routes]:
                sub = work / (name if i == 0 else f"{name}-{i + 1}")
                job = {"ship_dir": str(to), "route": name, "output": str(sub / "output.pt")}
                res = _spawn("torchkiln.ship.probe", job, sub, timeout_s)
                res.pop("traceback", None)
                if i == 0:
                    got[name] = res
                if rounds > 1:
                    got[name].setdefault("rounds", []).append(_round(res, got["cold"], i))
        if i == 0:
            for name in routes:
                if got[name].get("ok") and got["cold"].get("ok"):
                    got[name].update(
                        _compare(work / name / "output.pt", work / "cold" / "output.pt", precision)
                    )
            if paired and rounds > 1:
                for name in ["cold", *routes]:
                    got[name].setdefault("rounds", []).append(_round(got[name], got["cold"], 0))
    return got


def _paired_round(
    to: Path, work: Path, routes: list[str], timeout_s: float
) -> dict[str, dict[str, Any]]:
    """The cold process, measured and then kept waiting, while each route's process in turn is
    measured and timed against it rep by rep (ship.pairing); every process's own result."""
    from torchkiln.runner.launch import spawn

    listener = pairing.Listener()
    started: list[subprocess.Popen] = []

    def start(name: str) -> tuple[subprocess.Popen, Path, Any]:
        sub = work / name
        job = {"ship_dir": str(to), "route": name, "output": str(sub / "output.pt")}
        proc = _launch("torchkiln.ship.probe", {**job, "pair_socket": listener.address}, sub)
        started.append(proc)
        return proc, sub, listener.accept(proc, timeout_s)

    def finish(proc: subprocess.Popen, sub: Path, stream: Any) -> dict[str, Any]:
        if stream is None and proc.poll() is None:
            spawn.kill_group(proc)  # not ready within timeout_s
            proc.wait()
            return {"ok": False, "error": f"did not finish within {timeout_s:.0f} s"}
        pairing.release(stream)
        res = _collect(proc, sub, timeout_s)
        res.pop("traceback", None)
        return res

    got: dict[str, dict[str, Any]] = {}
    try:
        cold_proc, cold_dir, cold = start("cold")
        for name in routes:
            proc, sub, stream = start(name)
            pair = pairing.paired_reps(cold, stream) if cold and stream else None
            got[name] = finish(proc, sub, stream)
            if pair is not None:
                got[name]["paired"] = pair
        got = {"cold": finish(cold_proc, cold_dir, cold), **got}
    except BaseException:
        # A Ctrl-C or a failure here: the waiting processes must not outlive the measurement.
        for proc in started:
            spawn.kill_group(proc)
        raise
    finally:
        listener.close()
    return got


def _round(res: dict[str, Any], cold: dict[str, Any], i: int) -> dict[str, Any]:
    """One round's numbers of a route: its first fast output, steady step and, beside the cold
    process of the same round, the steady step's ratio less one."""
    steady = (res.get("steady_ms") or {}).get("median") if res.get("ok") else None
    row: dict[str, Any] = {"ok": bool(res.get("ok")), "first_fast_s": res.get("first_fast_s")}
    row["steady_ms"] = steady
    cold_rounds = cold.get("rounds") or []
    base = cold_rounds[i]["steady_ms"] if len(cold_rounds) > i else None
    row["steady_vs_cold"] = steady / base - 1 if steady and base else None
    if not res.get("ok"):
        row["error"] = res.get("error")
    return row


def ship_workload(
    workload: str,
    spec: str,
    *,
    step: str = "infer",
    device: str = "cpu",
    preset: str = "full",
    batch_size: int | None = None,
    to: str | Path,
    package: str = "auto",
    measure: bool = True,
    seed: int = 0,
    source: dict[str, Any] | None = None,
    probe_timeout_s: float = PROBE_TIMEOUT_S,
    repair_plan: str | Path | None = None,
    rounds: int = 1,
) -> dict[str, Any]:
    """Build the ship directory ``to`` for ``spec`` on ``workload``; returns its manifest.
    Each route's measuring process is stopped after ``probe_timeout_s`` (its result then says
    so, and the route is left out of the load order); ``rounds``: how many times each route's
    process is started (measure_routes). A pick with remedies for graph breaks
    (``+fix=``) needs its tune's ``repair_plan`` (RUN_DIR/repair/plan.json): the directory is
    built on the rewritten copy the pick's trial ran, and holds the patch (fixes.patch) the
    production model's source must carry."""
    if package not in PACKAGES:
        raise KilnUserError(f"--package {package!r}; choose from {list(PACKAGES)}")
    plan = _plan_for(spec, repair_plan)
    to = Path(to)
    _writable(to)
    shutil.rmtree(to / "artifacts", ignore_errors=True)
    (to / PATCH_FILE).unlink(missing_ok=True)
    fixes = None
    if plan is not None:
        from torchkiln.repair.judge import shipped as shipped_remedies
        from torchkiln.repair.plan import load_plan

        fixes = shipped_remedies(load_plan(plan), spec, to)
    work = Path(tempfile.mkdtemp(prefix="kiln-ship-"))
    t0 = time.monotonic()
    job = dict(workload=workload, preset=preset, batch_size=batch_size, step=step, device=device)
    job.update(spec=spec, seed=seed, to=str(to), package=package, fixes=fixes)
    job["repair_plan"] = None if plan is None else str(plan)
    built = _spawn("torchkiln.ship.build", job, work / "build", BUILD_TIMEOUT_S)
    if not built.get("ok"):
        raise KilnUserError(f"building the ship directory failed: {built.get('error')}")
    for only, diagnosis, what in (
        ("aoti", "export", "no AOTInductor package"),
        ("precompiled", "precompile", "no precompiled function"),
    ):
        if package == only and only not in built["artifacts"]:
            why = built.get(diagnosis) or {}
            error = f" ({why['error']})" if why.get("error") else ""
            raise KilnUserError(
                f"--package {only}: {what}: {why.get('reason')}{error}; remedy: {why.get('remedy')}"
            )
    artifacts = {
        name: describe_artifact(to, a.pop("file"), **a) for name, a in built["artifacts"].items()
    }
    _write_module(to, spec, step, device, fixes)
    doc: dict[str, Any] = {
        "kiln": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "spec": spec,
        "workload": workload,
        "step": step,
        "device": device,
        "preset": preset,
        "batch_size": batch_size,
        "seed": seed,
        "source": source,
        "fixes": fixes,
        # Where the pick's rewritten copy is read from when the routes are measured.
        "repair_plan": job["repair_plan"],
        "environment": built["environment"],
        "model_hash": built["model_hash"],
        "model_module": built.get("model_module"),
        "shapes": built["shapes"],
        "artifacts": artifacts,
        "export": built.get("export"),
        "build_phases_s": built.get("phases"),
        "precompile": built.get("precompile"),
        "route_order": [r for r in ARTIFACT_ROUTES if r in artifacts],
        "routes": None,
    }
    write_manifest(to, doc)
    if measure:
        serving = [r for r in ARTIFACT_ROUTES if r in artifacts]
        precision = parse_variant(spec).precision
        doc["routes"] = measure_routes(
            to, work / "routes", serving, probe_timeout_s, precision, rounds
        )
        doc["route_order"] = _order(doc["routes"])
    doc["build_s"] = time.monotonic() - t0
    write_manifest(to, doc)
    shutil.rmtree(work, ignore_errors=True)
    return {"schema": "torchkiln.ship/1", **doc}


def _plan_for(spec: str, repair_plan: str | Path | None) -> Path | None:
    """The repair plan a pick with remedies is built from; None for a pick without."""
    if not parse_variant(spec).fixes:
        return None
    if repair_plan is None or not Path(repair_plan).is_file():
        where = f" ({repair_plan} is missing)" if repair_plan is not None else ""
        raise KilnUserError(
            f"the pick {spec!r} carries remedies for graph breaks: it ships from its tune's run "
            f"directory, whose repair/plan.json holds them{where}"
        )
    return Path(repair_plan)


def _pick(doc: dict[str, Any], run_dir: Path) -> str:
    from torchkiln.tune.select import passed

    best = (doc.get("selection") or {}).get("best")
    if not best:
        raise KilnUserError(f"{run_dir}: the tune made no pick, so there is nothing to ship")
    trials = [*(doc.get("trials") or []), *(doc.get("head_to_head_trials") or [])]
    mine = [t for t in trials if t.get("variant") == best]
    if not mine or not any(passed(t) for t in mine):
        raise KilnUserError(
            f"{run_dir}: the pick {best!r} did not pass its correctness check; not shipped"
        )
    if best.split("+")[0].split(":")[0] == "eager":
        raise KilnUserError(f"{run_dir}: the pick is eager: nothing is compiled, nothing to ship")
    return best


def ship(
    run_dir: str | Path,
    *,
    to: str | Path | None = None,
    package: str = "auto",
    measure: bool = True,
) -> dict[str, Any]:
    """`kiln ship RUN_DIR`: ship the pick of the tune in ``run_dir`` (default to RUN_DIR/ship),
    and add the measured routes to the tune's results.json and report.md."""
    run_dir = Path(run_dir)
    path = run_dir / "results.json"
    if not path.is_file():
        raise KilnUserError(f"{str(path)!r} does not exist: give the --out of a `kiln tune`")
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise KilnUserError(f"{path}: not valid JSON ({exc})") from exc
    spec = _pick(doc, run_dir)
    manifest = ship_workload(
        doc["workload"],
        spec,
        step=doc.get("step", "infer"),
        device=doc.get("device", "cpu"),
        preset=doc.get("preset", "full"),
        batch_size=doc.get("batch_size"),
        to=to or run_dir / "ship",
        package=package,
        measure=measure,
        source={"run_dir": str(run_dir), "created": doc.get("created")},
        repair_plan=run_dir / "repair" / PLAN_FILE if parse_variant(spec).fixes else None,
    )
    from torchkiln.report.render import markdown
    from torchkiln.runner.protocol.worker import write_json
    from torchkiln.ship.report import summary

    doc["ship"] = summary(manifest, to or run_dir / "ship")
    write_json(path, doc)
    if (run_dir / "report.md").exists():
        (run_dir / "report.md").write_text(markdown(doc))
    return manifest
