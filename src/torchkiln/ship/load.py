"""`torchkiln.load(DIR, model)`: the shipped pick in a production process, through the fastest
route that fits, in the order `kiln ship` measured: the AOTInductor package, the precompiled
forward or the compile cache, else a cold compile.

Which route and why is logged, and kept on the returned object (`kiln_route`, `kiln_reason`).
A manifest that does not fit (other torch, GPU, model) is a warning and a cold compile: the
result is the model's, only its first call is slower. An artifact whose bytes differ from the
manifest's sha256 is refused: `ShipIntegrityError`, raised before anything reads it, as loading
altered compiled code could run anything."""

from __future__ import annotations

import contextlib
import logging
import tarfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torchkiln.errors import KilnUserError
from torchkiln.repair.remedies import Remedies
from torchkiln.ship.layout import to_layout
from torchkiln.ship.manifest import (
    environment,
    mismatches,
    model_hash,
    read_manifest,
    state_hashes,
    verify_artifact,
)

log = logging.getLogger("torchkiln.ship")
ROUTES = ("aoti", "precompiled", "cache", "cold")
ARTIFACT_ROUTES = ROUTES[:-1]


class ShipFallbackWarning(UserWarning):
    """The shipped artifacts do not fit this process; the model is compiled cold instead."""


class Shipped:
    """The model, ready to call, as a route of the ship directory made it. Inference calls run
    under no_grad, and every call under the pick's precision flags, autocast and remedies for
    graph breaks (Dynamo settings, inputs marked dynamic)."""

    def __init__(self, run: Any, doc: dict[str, Any], route: str, reason: str) -> None:
        import torch

        from torchkiln.runner.protocol.settings import autocast, precision_flags
        from torchkiln.variants import parse_variant

        self._run = run
        self.variant = parse_variant(doc["spec"])
        device = doc.get("device", "cpu")
        self._autocast = lambda: autocast(device, self.variant.precision)
        self._flags = lambda: precision_flags(self.variant.precision)
        self._grad = torch.no_grad if doc.get("step") == "infer" else torch.enable_grad
        self._remedies = Remedies.of(doc.get("fixes"))
        self.kiln_route = route
        self.kiln_reason = reason
        self.kiln_manifest = doc
        self.kiln_load_s = 0.0
        self.kiln_load_phases: dict[str, float] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        cl = self.variant.channels_last
        args = tuple(to_layout(a, cl) for a in args)
        kwargs = {k: to_layout(v, cl) for k, v in kwargs.items()}
        self.variant.backend.before_step()
        with self._grad(), self._flags(), self._autocast():
            with self._remedies.around_call(args, kwargs):
                return self._run(*args, **kwargs)

    @property
    def kiln_fallback_calls(self) -> int:
        """Calls the precompiled route compiled cold (no saved function's guards accepted
        them); 0 on the other routes."""
        return int(getattr(self._run, "fallback_calls", 0))

    @property
    def kiln_fallback_reason(self) -> str:
        """Why the first call compiled cold was turned away (the guard that failed); "" when
        none was."""
        return str(getattr(self._run, "fallback_reason", ""))

    def __repr__(self) -> str:
        return f"Shipped(spec={self.variant.spec!r}, route={self.kiln_route!r})"


def _fit(doc: dict[str, Any], model: Any) -> list[str]:
    """What keeps every artifact from this process: environment fields, then the model's
    packages, parameter layout and module source. Its weights are checked apart, only for an
    artifact that holds them (`_weights_differ`)."""
    problems = [
        str(m) for m in mismatches(doc.get("environment") or {}, environment(doc["device"]))
    ]
    param = next(iter(model.parameters()), None)
    if param is not None and param.device.type != doc["device"].split(":")[0]:
        problems.append(f"device: built for {doc['device']!r}, the model is on {param.device}")
    built = doc.get("model_hash") or {}
    # A manifest without `layout` predates it: its weights are checked for every route.
    here = model_hash(model, values="layout" not in built)
    if "packages" in built and built["packages"] != here["packages"]:
        problems.append(
            f"model packages: built with {built.get('packages')}, this process has "
            f"{here['packages']}"
        )
    for part in ("layout", "code") if "layout" in built else ("params", "code"):
        if built.get(part) != here[part]:
            what = {
                "params": "weights",
                "layout": "parameter names, dtypes or shapes",
                "code": "module source",
            }[part]
            problems.append(f"model {part} hash: the model's {what} differ from the shipped one's")
            patch = Remedies.of(doc.get("fixes")).patch
            if part == "code" and patch:
                problems[-1] += (
                    f" (the pick's remedies rewrite the model's source: apply {patch} from the "
                    "ship directory to the model's code)"
                )
    return problems


def _holds_weights(route: str, doc: dict[str, Any]) -> bool:
    """Whether ``route``'s artifact holds the weights it was built with: an AOTInductor package
    always, any artifact of a pick that folds them into its graph (Inductor's freezing)."""
    from torchkiln.variants import parse_variant

    return route == "aoti" or parse_variant(doc["spec"]).backend.embeds_weights


def _weights_differ(doc: dict[str, Any], model: Any) -> bool:
    built = (doc.get("model_hash") or {}).get("params")
    return built != state_hashes(model, values=True)[1]


def _extract_kernels(path: Path) -> None:
    """Inductor's compiled kernels (the C++ or Triton binaries its cache entries point to) into
    this process's Inductor cache; files already there are kept. Keys are hashes of the source
    and compile command, so an entry can only be used by the very code it was built from."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    root = Path(cache_dir())
    with tarfile.open(path) as tar:
        members = [m for m in tar.getmembers() if not (root / m.name).exists()]
        # The "data" filter (Python 3.11.4+) refuses links and paths outside ``root``.
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(root, members=members, **safe)


@contextlib.contextmanager
def _phase(phases: dict[str, float], name: str) -> Iterator[None]:
    t = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - t


def _load_cache(ship_dir: Path, doc: dict[str, Any], model: Any, phases: dict[str, float]) -> Any:
    from torchkiln.tune.recommend import apply

    _prime_caches(ship_dir, doc["artifacts"], phases)
    with _phase(phases, "apply_s"):
        return apply(model, doc["spec"], doc["device"])


def _prime_caches(ship_dir: Path, arts: dict[str, Any], phases: dict[str, float]) -> None:
    """Mega-Cache's entries and Inductor's kernels into this process's caches."""
    import torch

    if "cache" in arts and hasattr(torch.compiler, "load_cache_artifacts"):
        with _phase(phases, "compile_cache_s"):
            data = verify_artifact(ship_dir, arts["cache"]).read_bytes()
            torch.compiler.load_cache_artifacts(data)
    if "kernels" in arts:
        with _phase(phases, "kernels_s"):
            _extract_kernels(verify_artifact(ship_dir, arts["kernels"]))


def _load_precompiled(
    ship_dir: Path, doc: dict[str, Any], model: Any, phases: dict[str, float]
) -> Any:
    from torchkiln.ship import precompiled

    arts = doc["artifacts"]
    path = verify_artifact(ship_dir, arts["precompiled"])
    # The functions hold Inductor's code; its compiled binaries (C++ or Triton) come from the
    # caches, without which the first call builds them again.
    _prime_caches(ship_dir, arts, phases)
    with _phase(phases, "functions_s"):
        return precompiled.load(
            path, model, doc["spec"], doc.get("model_module"), doc.get("device", "cpu")
        )


def _load_aoti(ship_dir: Path, doc: dict[str, Any], model: Any, phases: dict[str, float]) -> Any:
    import torch

    arts = doc["artifacts"]
    path = verify_artifact(ship_dir, arts["aoti"])
    if "kernels" in arts:
        # Loading a package checks which vector ISA this CPU builds for by compiling a probe
        # per ISA, on a GPU host too: 56 s of a 57 s load with an empty Inductor cache (tiny
        # MLP, 2 shared cores, torch 2.14.1). The build's probes are in the kernels archive.
        with _phase(phases, "kernels_s"):
            _extract_kernels(verify_artifact(ship_dir, arts["kernels"]))
    with _phase(phases, "package_s"):
        return torch._inductor.aoti_load_package(str(path))


def load(ship_dir: str | Path, model: Any, *, route: str | None = None) -> Shipped:
    """The shipped pick applied to ``model``. ``route`` forces one of ROUTES (the default takes
    the manifest's order, measured by `kiln ship`). Raises ShipIntegrityError for an altered
    artifact and ShipManifestError for a directory that is not a ship directory."""
    import torch

    from torchkiln.tune.recommend import apply

    if route is not None and route not in ROUTES:
        raise ValueError(f"route={route!r}; choose from {list(ROUTES)}")
    ship_dir = Path(ship_dir)
    doc = read_manifest(ship_dir)
    if doc.get("step") == "infer":
        model.eval()
    t0 = time.perf_counter()
    phases: dict[str, float] = {}
    with _phase(phases, "imports_s"):
        # Every route's first import of the compiler stack (over a second on its own), kept
        # apart from what the artifacts cost.
        import torch._dynamo  # noqa: F401
        import torch._inductor.compile_fx  # noqa: F401
    # Before any route compiles: the helpers the pick's remedies disable.
    Remedies.of(doc.get("fixes")).prepare(model)
    with _phase(phases, "check_s"):
        problems = _fit(doc, model) if route != "cold" else []
    arts = doc.get("artifacts") or {}
    order = [route] if route else [*doc.get("route_order", ARTIFACT_ROUTES), "cold"]
    notes: list[str] = []
    chosen: tuple[str, Any, str] | None = None
    # Hashed once, only if a route needs it; a manifest without `layout` had them checked in
    # _fit (a difference there is a problem, and no artifact route is tried).
    has_layout = "layout" in (doc.get("model_hash") or {})
    weights_differ: bool | None = None if has_layout else False
    for r in order:
        if r == "cold":
            break
        if problems:
            msg = "; ".join(problems)
            warnings.warn(
                f"kiln ship {ship_dir}: compiling cold, the artifacts do not fit: {msg}",
                ShipFallbackWarning,
                stacklevel=2,
            )
            notes.append(f"artifacts do not fit ({msg})")
            break
        if r == "cache" and not hasattr(torch.compiler, "load_cache_artifacts"):
            notes.append(f"torch {torch.__version__} cannot load a compile-cache artifact")
            continue
        if r not in arts:
            diagnosis = {"aoti": "export", "precompiled": "precompile"}.get(r)
            why = (doc.get(diagnosis) or {}).get("reason") if diagnosis else None
            notes.append(f"no {r} artifact" + (f" ({why})" if why else ""))
            continue
        if r == "precompiled" and not hasattr(torch.compiler, "load_compiled_function"):
            notes.append(f"torch {torch.__version__} cannot load a precompiled function")
            continue
        if _holds_weights(r, doc):
            if weights_differ is None:
                with _phase(phases, "check_s"):
                    weights_differ = _weights_differ(doc, model)
            if weights_differ:
                notes.append(
                    f"the {r} artifact holds the weights it was built with, and this model's "
                    "differ (model params hash)"
                )
                continue
        loader = {"aoti": _load_aoti, "precompiled": _load_precompiled, "cache": _load_cache}[r]
        try:
            run = loader(ship_dir, doc, model, phases)
        except KilnUserError:
            raise  # an altered artifact is refused, never worked around
        except Exception as exc:  # noqa: BLE001  (the next route serves; the reason is kept)
            msg = f"{type(exc).__name__}: {str(exc)[:300]}"
            warnings.warn(
                f"kiln ship {ship_dir}: the {r} route failed to load ({msg}); trying the next",
                ShipFallbackWarning,
                stacklevel=2,
            )
            notes.append(f"the {r} route failed to load ({msg})")
            continue
        chosen = (r, run, f"the {r} artifact fits this environment and model")
        break
    if chosen is None:
        if route == "cold":
            notes = ["asked for"]
        elif not notes:
            notes = ["`kiln ship` measured no artifact route as fit to serve (route_order)"]
        reason = "cold compile: " + "; ".join(notes)
        if weights_differ:
            warnings.warn(
                f"kiln ship {ship_dir}: compiling cold, no artifact fits: {'; '.join(notes)}",
                ShipFallbackWarning,
                stacklevel=2,
            )
        with _phase(phases, "apply_s"):
            chosen = ("cold", apply(model, doc["spec"], doc["device"]), reason)
    elif notes:
        chosen = (chosen[0], chosen[1], chosen[2] + " (" + "; ".join(notes) + ")")
    shipped = Shipped(chosen[1], doc, chosen[0], chosen[2])
    shipped.kiln_load_s = time.perf_counter() - t0
    shipped.kiln_load_phases = {k: round(v, 4) for k, v in phases.items()}
    log.info("kiln ship %s: route %s: %s", ship_dir, shipped.kiln_route, shipped.kiln_reason)
    return shipped
