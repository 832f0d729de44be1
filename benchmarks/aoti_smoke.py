"""Does an AOTInductor package load on this machine, in plain PyTorch, without kiln?

`kiln ship`'s AOTInductor route can crash inside torch's package loader
(AOTIModelPackageLoader) while the compile-cache route of the same model runs. This script
separates the machine from kiln: a fresh process exports a small MLP and packages it, and fresh
processes load the package and call it, each way below, reporting exit code, seconds and the
Python stack of a crash:

- plain: `torch._inductor.aoti_load_package(path)`;
- single-threaded: the same with ``run_single_threaded=True``;
- autocast: a package exported under bf16 autocast, as kiln exports a bf16 pick.

    python benchmarks/aoti_smoke.py --device cuda --out benchmarks/results/ship/h200/aoti-smoke.json
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WAYS = ("plain", "single-threaded", "autocast")


def _model(device: str):
    import torch

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8))
    return m.to(device).eval(), torch.randn(16, 64, device=device)


def build(device: str, path: str, autocast: bool) -> None:
    import torch

    model, x = _model(device)
    ctx = torch.autocast(device, torch.bfloat16) if autocast else torch.no_grad()
    with torch.no_grad(), ctx:
        ep = torch.export.export(model, (x,))
        torch._inductor.aoti_compile_and_package(ep, package_path=path)


def load(device: str, path: str, single: bool) -> None:
    import torch

    model, x = _model(device)
    run = torch._inductor.aoti_load_package(path, run_single_threaded=single)
    with torch.no_grad():
        got = run(x)
        want = model(x)
    diff = float((got.float() - want.float()).abs().max())
    print(json.dumps({"max_abs_diff": diff}))


def _child(args: list[str], timeout_s: float) -> dict:
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    try:
        p = subprocess.run(
            [sys.executable, __file__, *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {"rc": None, "error": f"did not finish within {timeout_s:.0f} s"}
    out = {"rc": p.returncode, "seconds": round(time.perf_counter() - t0, 2)}
    err = p.stderr
    at = err.rfind("Fatal Python error")
    if p.returncode != 0:
        out["stderr"] = err[at:].split("\nExtension modules:")[0][:3000] if at >= 0 else err[-1500:]
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if lines:
        out.update(json.loads(lines[-1]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=None)
    ap.add_argument("--timeout", type=float, default=240.0)
    ap.add_argument("--child", nargs=3, metavar=("WHAT", "PATH", "FLAG"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        faulthandler.enable()
        what, path, flag = args.child
        if what == "build":
            build(args.device, path, flag == "1")
        else:
            load(args.device, path, flag == "1")
        return 0
    import torch

    doc = {
        "benchmark": "aoti-smoke",
        "torch": torch.__version__,
        "device": args.device,
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        "ways": {},
    }
    with tempfile.TemporaryDirectory(prefix="aoti-smoke-") as tmp:
        for autocast in (False, True):
            pkg = str(Path(tmp) / f"model-{int(autocast)}.pt2")
            key = "build-autocast" if autocast else "build"
            common = ["--device", args.device]
            doc["ways"][key] = _child(
                [*common, "--child", "build", pkg, str(int(autocast))], args.timeout
            )
            print(key, doc["ways"][key], flush=True)
        for way in WAYS:
            pkg = str(Path(tmp) / f"model-{int(way == 'autocast')}.pt2")
            flag = "1" if way == "single-threaded" else "0"
            common = ["--device", args.device]
            doc["ways"][way] = _child([*common, "--child", "load", pkg, flag], args.timeout)
            print(way, doc["ways"][way], flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=2))
    print(f"{'way':<18}{'rc':>5}{'seconds':>9}  max_abs_diff")
    for way, r in doc["ways"].items():
        print(f"{way:<18}{str(r.get('rc')):>5}{str(r.get('seconds')):>9}  {r.get('max_abs_diff')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
