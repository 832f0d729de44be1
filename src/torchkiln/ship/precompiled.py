"""The precompiled route: the pick's forward compiled ahead of time (`torch.compile(...)
.aot_compile`), saved whole (Dynamo's guards and bytecode, AOT autograd's wrappers, Inductor's
code) and loaded with `torch.compiler.load_compiled_function`, so that a production process
skips Dynamo's tracing and AOT autograd, which a compile cache cannot skip.

One compiled function per guard set: the first served shape is compiled, and each further one
only when no function compiled so far accepts it (under ``dynamic=true`` one may serve all). A
call that no function accepts (a shape the ship did not see) is compiled cold, once per new
guard failure, as torch.compile would."""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import logging
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torchkiln.repair.remedies import Remedies
from torchkiln.variants import aot_entry

log = logging.getLogger("torchkiln.ship")
META = "meta.json"  # how the functions are called: {"autocast_off", "module_refs"}


def _args(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return ((), dict(inputs)) if isinstance(inputs, dict) else (tuple(inputs), {})


def build(
    model: Any,
    inputs: list[Any],
    spec: str,
    device: str,
    path: Path,
    remedies: Remedies | None = None,
) -> dict[str, Any]:
    """Compile ``model``'s forward for ``inputs`` (each a tuple of args or a dict of kwargs) under
    the pick's precision, layout and remedies for graph breaks, and write the functions to
    ``path``. Returns {"functions": n} or {"reason", "remedy", "error"} when it cannot."""
    import torch

    from torchkiln.runner.protocol.settings import autocast, map_tensors, precision_flags
    from torchkiln.ship.layout import to_layout
    from torchkiln.variants import parse_variant
    from torchkiln.variants.base import PrecompileUnsupported

    v = parse_variant(spec)
    if v.channels_last:
        model = model.to(memory_format=torch.channels_last)
    compiled: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
    blobs: list[bytes] = []
    contexts: set[bool] = set()  # the call contexts the functions' guards accept
    try:
        with torch.no_grad(), precision_flags(v.precision), autocast(device, v.precision):
            for batch in inputs:
                args, kwargs = _args(map_tensors(batch, lambda x: to_layout(x, v.channels_last)))
                if any(_accepts(f, model, args, kwargs) for f, _, _ in compiled):
                    continue
                with (remedies or Remedies()).around_call(args, kwargs):
                    f = v.backend.precompile(model, args, kwargs)
                    # Run once: the kernels' autotuned configs land in the compile cache the
                    # kernels archive carries, so a loading process does not benchmark them
                    # again on its first call (resnet50 bf16 on an H200: 0.98 s of a 1.3 s
                    # first call, torch 2.11).
                    f(model, *args, **kwargs)
                compiled.append((f, args, kwargs))
            refs: dict[str, str] = {}
            for f, _, _ in compiled:
                refs |= aot_entry.module_refs(f)
            read = _reader(refs)
            for i, (f, args, kwargs) in enumerate(compiled):
                tmp = path.with_name(f"{path.name}.fn{i}")
                f.save_compiled_function(str(tmp))
                blobs.append(tmp.read_bytes())
                tmp.unlink()
                # As a loading process meets it: read back from its bytes, its guards rebuilt
                # (in the context it is called in, as `load` reads it).
                found = _accepting_context(read(blobs[-1]), model, args, kwargs, device)
                if isinstance(found, str):
                    return {
                        "reason": "the ahead-of-time compiled function, read back, rejects the "
                        "very inputs it was compiled on",
                        "remedy": "the compile-cache route serves the pick",
                        "error": found,
                    }
                contexts.add(found)
    except PrecompileUnsupported as exc:
        return {
            "reason": str(exc),
            "remedy": "the compile-cache route serves the pick",
            "error": "",
        }
    except Exception as exc:  # noqa: BLE001  (a failed precompile is reported, not fatal)
        return diagnose(exc)
    if len(contexts) > 1:
        return {
            "reason": "the compiled functions' guards accept their inputs in different contexts "
            "(some only with autocast off)",
            "remedy": "the compile-cache route serves the pick",
            "error": "",
        }
    autocast_off = contexts.pop() if contexts else False
    meta = json.dumps({"autocast_off": autocast_off, "module_refs": refs}).encode()
    with tarfile.open(path, "w") as tar:
        for name, blob in [*((f"fn{i}.bin", b) for i, b in enumerate(blobs)), (META, meta)]:
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return {"functions": len(blobs), "autocast_off": autocast_off}


def _reader(refs: dict[str, str]) -> Any:
    """bytes -> the compiled function, as torch's loader reads it."""
    import torch

    loader = torch.compiler.load_compiled_function
    kw: dict[str, Any] = {}
    if "f_globals" in inspect.signature(loader).parameters:
        # The namespace the compiled function started from, as torch's loader asks for the
        # guards and code that read it, with the modules Dynamo had installed there.
        kw["f_globals"] = aot_entry.load_globals(refs)
    return lambda blob: loader(io.BytesIO(blob), **kw)


def _context(autocast_off: bool, device: str) -> Any:
    """Where the functions are checked and called: as the caller runs, or with autocast off."""
    import torch

    if not autocast_off:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.split(":")[0], enabled=False)


def _accepting_context(
    f: Any, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], device: str
) -> bool | str:
    """Whether ``f``'s guards accept the inputs it was compiled on as the caller runs (False) or
    only with autocast off (True); the guard's words where neither. A torch whose saved
    function rebuilds its inputs' dispatch keys without the autocast key they were compiled
    under turns every autocast call away (resnet50 + bf16 on an H200, torch 2.11, read back in
    a new process: 'dispatch key set mismatch ... actual ... AutocastCUDA'); the graph holds
    its casts already, so outside autocast it computes the same."""
    if _accepts(f, model, args, kwargs):
        return False
    with _context(True, device):
        if _accepts(f, model, args, kwargs):
            return True
    return _rejection(f, model, args, kwargs)


def diagnose(exc: BaseException) -> dict[str, str]:
    """Why the ahead-of-time compile or its saving failed, in plain words, with the remedy."""
    from torchkiln.ship.export import DYNAMIC_CACHE_REASON
    from torchkiln.ship.export import diagnose as diagnose_export

    text = f"{type(exc).__name__}: {exc}"
    first = text.strip().splitlines()[0][:300]
    if "<locals>" in text or "local scope" in text:
        return {
            "reason": "the model (or an object its forward reads) is a class defined inside a "
            "function, which a saved compiled function cannot name in another process",
            "remedy": "define the class at module level",
            "error": first,
        }
    if "cannot be serialized" in text:
        return {
            "reason": "a guard the compiled forward needs cannot be saved: it checks an object's "
            "identity (ID_MATCH: an object the forward reads, a config or a class, whose id only "
            "means something in the process that compiled it)",
            "remedy": "the compile-cache route serves the pick",
            "error": first,
        }
    if "Guarded object must be identical" in text:
        # torch 2.11 makes each guard's export record from the object its source reads, twice,
        # and stops where the two differ: an object made anew on every access. GPT-2 as it comes
        # (transformers 5.25) failed so on transformers' `_PerLayerConfigView`; the same model
        # with `use_cache = False` precompiled (the tiny GPT-2 on a CPU, torch 2.11.0).
        decoder = "_PerLayerConfigView" in text
        return {
            "reason": "a guard the compiled forward needs reads an object made anew on every "
            "access, which torch cannot record"
            + (" (a Hugging Face config's per-layer view)" if decoder else ""),
            "remedy": (
                "model.config.use_cache = False before shipping (a decoder then returns logits "
                "only); the compile-cache route serves the pick as it is"
                if decoder
                else "the compile-cache route serves the pick"
            ),
            "error": first,
        }
    if "graph break" in text.lower() or type(exc).__name__ == "Unsupported":
        return {
            "reason": "the forward breaks the graph, and an ahead-of-time compile is one whole "
            "graph",
            "remedy": "`kiln explain` names the break and its fix; the compile-cache route "
            "serves the pick",
            "error": first,
        }
    why = diagnose_export(exc)
    if why["reason"] != DYNAMIC_CACHE_REASON:
        # The other export diagnoses (a Dim range, say) are export's own, not this compile's.
        why = {
            "reason": "torch.compile's ahead-of-time compile failed",
            "remedy": "see the error; the compile-cache route serves the pick",
            "error": why["error"],
        }
    return why


def _accepts(
    f: Any, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], context: Any = None
) -> bool:
    """Whether the compiled function's guards accept this call (inside ``context``)."""
    check = getattr(f, "guard_check", None)
    if check is None:
        raise RuntimeError("this torch's compiled functions cannot check their guards")
    with context or contextlib.nullcontext():
        return bool(check(model, *args, **kwargs))


def _rejection(f: Any, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The guard that turned this call away, in Dynamo's words, where this torch says."""
    manager = getattr(getattr(f, "_artifacts", None), "guard_manager", None)
    verbose = getattr(manager, "check_verbose", None)
    prepare = getattr(f, "prepare_f_locals", None)
    if verbose is None or prepare is None:
        return "this torch does not say which guard failed"
    try:
        info = verbose(prepare(model, *args, **kwargs))
    except (RuntimeError, TypeError, AttributeError, KeyError) as exc:
        return f"the guards could not say why ({type(exc).__name__}: {exc})"
    parts = getattr(info, "verbose_code_parts", None) or [str(info)]
    return "; ".join(" ".join(str(p).split()) for p in parts)[:500]


class Precompiled:
    """Calls the first loaded function whose guards accept the call; otherwise a cold compile of
    the same variant, made on first need (``fallback_calls`` counts the calls it served;
    ``fallback_reason`` keeps the guard that turned the first of them away)."""

    def __init__(
        self, model: Any, fns: list[Any], cold: Any, autocast_off: bool = False, device: str = ""
    ) -> None:
        self.model = model
        self.fns = fns
        self._context = lambda: _context(autocast_off, device)
        self._cold_factory = cold
        self._cold: Any = None
        self.fallback_calls = 0
        self.fallback_reason = ""
        for f in fns:
            if hasattr(f, "disable_guard_check"):
                # Checked here once per call, not again inside the function.
                f.disable_guard_check()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._context():
            for f in self.fns:
                if _accepts(f, self.model, args, kwargs):
                    return f(self.model, *args, **kwargs)
        if self._cold is None:
            self.fallback_reason = _rejection(self.fns[0], self.model, args, kwargs)
            log.warning(
                "kiln ship: no precompiled function accepts this call (a shape or setting the "
                "ship was not built on); compiling it as torch.compile would. The first "
                "function's guard: %s",
                self.fallback_reason,
            )
            self._cold = self._cold_factory()
        self.fallback_calls += 1
        return self._cold(*args, **kwargs)


@contextlib.contextmanager
def _module_named(name: str | None, here: str) -> Iterator[None]:
    """While the functions are read, ``name`` refers to the module ``here``: the classes they
    name resolve to this process's (unpickling resolves them by module name, once)."""
    if not name or name == here:
        yield
        return
    before = sys.modules.get(name)
    sys.modules[name] = sys.modules[here]
    try:
        yield
    finally:
        if before is None:
            del sys.modules[name]
        else:
            sys.modules[name] = before


def load(
    path: Path, model: Any, spec: str, built_module: str | None = None, device: str = "cpu"
) -> Precompiled:
    """The functions in ``path`` (already checked against the manifest's sha256), bound to
    ``model``. ``built_module``: the name the model's class had where the functions were built.
    The functions name it (their guards check the model's type); where this process imports the
    same class under another name, that name refers to this process's module while they are
    read (the manifest's model hash has already matched the classes' source)."""
    import torch
    import torch._inductor.config

    from torchkiln.variants import parse_variant

    v = parse_variant(spec)
    if v.channels_last:
        model = model.to(memory_format=torch.channels_last)
    from torchkiln.runner.protocol.settings import autocast, precision_flags

    # Read in the context the functions are called in (Shipped's): a saved function's guards
    # are rebuilt from it. Read outside autocast, resnet50 + bf16's guards expected its input
    # without the AutocastCUDA dispatch key and turned every call under autocast away (H200,
    # torch 2.11); read where it is called, they accept it.
    # And under the pick's compiler settings, which torch takes from the reading process
    # (CUDA graphs for reduce-overhead among them).
    with (
        torch.no_grad(),
        precision_flags(v.precision),
        autocast(device, v.precision),
        torch._inductor.config.patch(v.backend.precompile_config()),
        tarfile.open(path) as tar,
        _module_named(built_module, type(model).__module__),
    ):
        files = [m for m in tar.getmembers() if m.isfile()]
        metas = [json.loads(tar.extractfile(m).read()) for m in files if m.name == META]
        meta = metas[0] if metas else {}
        read = _reader(meta.get("module_refs") or {})
        names = sorted((m for m in files if m.name != META), key=lambda m: int(m.name[2:-4]))
        fns = [read(tar.extractfile(m).read()) for m in names]
    if not fns:
        raise RuntimeError(f"{path}: holds no compiled function")
    off = bool(meta.get("autocast_off"))
    cold = lambda: v.backend.wrap(model, compile_scope="model")  # noqa: E731
    return Precompiled(model, fns, cold, off, device)
