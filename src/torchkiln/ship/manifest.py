"""The ship directory's manifest: what the artifacts were built with (environment, variant, shapes,
model hash) and each artifact's sha256, and the check of all that against a running process."""

from __future__ import annotations

import hashlib
import inspect
import json
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchkiln import __version__
from torchkiln.errors import KilnUserError

SHIP_SCHEMA = "torchkiln.ship/1"
MANIFEST = "manifest.json"
# A compiled artifact is only valid where these match the machine it was built on: Inductor's
# caches and an AOTInductor package hold code for one torch, one Triton, one CUDA, one GPU (or,
# on the CPU, one instruction set), and Dynamo's bytecode for one Python.
ENV_FIELDS = ("torch", "triton", "cuda", "gpu", "cpu_capability", "python")


class ShipIntegrityError(KilnUserError):
    """An artifact's bytes are not the ones the manifest names: truncated or altered."""


class ShipManifestError(KilnUserError):
    """The directory is not a ship directory, or its manifest does not parse."""


@dataclass(frozen=True)
class Mismatch:
    field: str
    built: Any
    here: Any

    def __str__(self) -> str:
        return f"{self.field}: built with {self.built!r}, this process has {self.here!r}"


def environment(device: str) -> dict[str, Any]:
    """The fields of ENV_FIELDS for this process and ``device``, plus kiln's version (recorded,
    not compared: the artifacts do not depend on it)."""
    import importlib.metadata

    import torch

    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = None
    gpu = None
    if device.startswith("cuda") and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(torch.device(device))
    cap = None
    get_cap = getattr(torch.backends.cpu, "get_cpu_capability", None)
    if device == "cpu" and get_cap is not None:
        cap = get_cap()
    return {
        "kiln": __version__,
        "torch": torch.__version__,
        "triton": triton if device.startswith("cuda") else None,
        "cuda": torch.version.cuda if device.startswith("cuda") else None,
        "gpu": gpu,
        "cpu_capability": cap,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "machine": platform.machine(),
    }


def mismatches(built: dict[str, Any], here: dict[str, Any]) -> list[Mismatch]:
    return [
        Mismatch(f, built.get(f), here.get(f)) for f in ENV_FIELDS if built.get(f) != here.get(f)
    ]


def _tensor_bytes(t: Any) -> Any:
    """The tensor's bytes as a buffer hashlib reads without a further copy."""
    import torch

    t = t.detach().to("cpu").contiguous().reshape(-1)
    return t.view(torch.uint8).numpy() if t.numel() else b""


def model_hash(model: Any, *, values: bool = True) -> dict[str, Any]:
    """sha256 of the parameters and buffers: `layout` of their names, dtypes and shapes, and
    `params` of those and their values (only with ``values``); `code`, of the source of every
    module class in the model; `packages`, the versions of the packages defining them. Only an
    artifact that holds the weights it was built with (an AOTInductor package, a frozen graph)
    needs the values checked: elsewhere the weights are the compiled code's inputs, read from
    the model at each call, and hashing them cost GPT-2 small 1.4 s of its load on an H100."""
    layout, params = state_hashes(model, values=values)
    code = hashlib.sha256()
    classes = sorted({type(m) for m in model.modules()}, key=lambda c: c.__qualname__)
    for cls in classes:
        try:
            text = inspect.getsource(cls)
        except (OSError, TypeError):
            text = ""  # a class defined in a REPL: its name alone is hashed
        # The qualified name, not the module: a workload file is imported under a name made
        # from its path (loader.py), and production imports the same classes by its own name.
        code.update(f"{cls.__qualname__}\n{text}".encode())
    out: dict[str, Any] = {"layout": layout, "code": code.hexdigest()}
    if params is not None:
        out["params"] = params
    out["packages"] = packages(classes)
    return out


def state_hashes(model: Any, *, values: bool) -> tuple[str, str | None]:
    """model_hash's `layout` and, with ``values``, its `params` (else None)."""
    layout = hashlib.sha256()
    params = hashlib.sha256() if values else None
    for name, t in sorted(model.state_dict().items()):
        head = f"{name}|{t.dtype}|{tuple(t.shape)}|".encode()
        layout.update(head)
        if params is not None:
            params.update(head)
            params.update(_tensor_bytes(t))
    return layout.hexdigest(), None if params is None else params.hexdigest()


def packages(classes: Any) -> dict[str, str]:
    """The version of each installed package that defines one of the model's classes
    (transformers, torchvision, ...): code the forward runs beyond the classes' own source, such
    as a decorator, which a saved compiled function no longer guards by identity. A module
    without a version (a user's file) is covered by the source hash."""
    import importlib.metadata

    out: dict[str, str] = {}
    for top in sorted({c.__module__.split(".")[0] for c in classes}):
        try:
            out[top] = importlib.metadata.version(top)
        except (importlib.metadata.PackageNotFoundError, ValueError):
            version = getattr(sys.modules.get(top), "__version__", None)
            if isinstance(version, str):
                out[top] = version
    return out


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def describe_artifact(ship_dir: Path, rel: str, **extra: Any) -> dict[str, Any]:
    path = ship_dir / rel
    return {"file": rel, "bytes": path.stat().st_size, "sha256": sha256_file(path), **extra}


def verify_artifact(ship_dir: Path, entry: dict[str, Any]) -> Path:
    """The artifact's path once its bytes match the manifest's sha256; ShipIntegrityError if
    not, before anything reads it."""
    path = ship_dir / entry["file"]
    if not path.exists():
        raise ShipIntegrityError(f"{path}: the manifest names this artifact but it is missing")
    size = path.stat().st_size
    if size != entry.get("bytes"):
        raise ShipIntegrityError(
            f"{path}: {size} bytes, the manifest says {entry.get('bytes')}: truncated or "
            "altered; refused (ship the directory again)"
        )
    digest = sha256_file(path)
    if digest != entry.get("sha256"):
        raise ShipIntegrityError(
            f"{path}: sha256 {digest[:16]}..., the manifest says {str(entry.get('sha256'))[:16]}"
            "...: altered; refused (ship the directory again)"
        )
    return path


def read_manifest(ship_dir: str | Path) -> dict[str, Any]:
    path = Path(ship_dir) / MANIFEST
    if not path.is_file():
        raise ShipManifestError(f"{str(path)!r} does not exist: not a `kiln ship` directory")
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ShipManifestError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("schema") != SHIP_SCHEMA:
        raise ShipManifestError(f"{path}: schema is not {SHIP_SCHEMA!r}")
    return doc


def write_manifest(ship_dir: Path, doc: dict[str, Any]) -> None:
    from torchkiln.runner.protocol.worker import write_json

    write_json(ship_dir / MANIFEST, {"schema": SHIP_SCHEMA, **doc})


def check(ship_dir: str | Path) -> list[str]:
    """`kiln ship --check`: what does not fit this machine (environment fields, artifacts whose
    bytes changed), without loading any model. Empty when everything fits."""
    ship_dir = Path(ship_dir)
    doc = read_manifest(ship_dir)
    built = doc.get("environment") or {}
    problems = [str(m) for m in mismatches(built, environment(doc.get("device", "cpu")))]
    for name, entry in (doc.get("artifacts") or {}).items():
        try:
            verify_artifact(ship_dir, entry)
        except ShipIntegrityError as exc:
            problems.append(f"artifact {name}: {exc}")
    return problems
