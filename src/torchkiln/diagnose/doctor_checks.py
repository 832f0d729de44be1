"""The doctor's checks. Each returns a Check: status, the evidence it saw, one-sentence remedy."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# `info` marks an optional extra that is absent: worth knowing, never a problem.
STATUSES = ("ok", "info", "warn", "fail")
SUPPORTED_TORCH = ((2, 11), (2, 14))  # oldest and newest minor versions kiln is tested on
MIN_FREE_GIB = 1.0


@dataclass
class Check:
    name: str
    status: str
    evidence: str
    remedy: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r}; choose from {list(STATUSES)}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:3])


def _run(cmd: list[str], timeout: float = 10.0) -> tuple[int | None, str]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def check_python() -> Check:
    v = sys.version_info
    ev = f"Python {platform.python_version()} ({sys.executable})"
    if v < (3, 10):
        return Check("python", "fail", ev, "Use Python 3.10 or newer (kiln requires it).")
    return Check("python", "ok", ev)


def check_torch() -> Check:
    try:
        import torch
    except ImportError as exc:
        return Check("torch", "fail", f"import torch failed: {exc}", "pip install torch")
    build = "CPU-only build"
    if torch.version.cuda:
        build = f"CUDA {torch.version.cuda} build"
    elif getattr(torch.version, "hip", None):
        build = f"ROCm {torch.version.hip} build"
    ev = f"torch {torch.__version__} ({build}), git {torch.version.git_version[:10]}"
    details = {"version": torch.__version__, "cuda": torch.version.cuda}
    ver = _version_tuple(torch.__version__)[:2]
    (lo, hi) = SUPPORTED_TORCH
    if ver < lo:
        return Check("torch", "fail", ev, f"Install torch {lo[0]}.{lo[1]} or newer.", details)
    if ver > hi:
        return Check(
            "torch",
            "warn",
            ev + f"; kiln is tested up to {hi[0]}.{hi[1]}",
            "Expect differences in Dynamo's messages; report anything kiln misreads.",
            details,
        )
    return Check("torch", "ok", ev, details=details)


def _nvidia_smi() -> tuple[list[str], str]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return [], "nvidia-smi not found"
    query = "--query-gpu=name,driver_version,memory.total"
    code, out = _run([exe, query, "--format=csv,noheader"])
    if code != 0:
        return [], f"nvidia-smi failed: {out.splitlines()[-1] if out else code}"
    return [ln.strip() for ln in out.splitlines() if ln.strip()], ""


def check_gpu() -> Check:
    import torch

    smi_rows, smi_err = _nvidia_smi()
    driver = smi_rows[0].split(",")[1].strip() if smi_rows else None
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        p = torch.cuda.get_device_properties(0)
        cc = f"{p.major}.{p.minor}"
        ev = (
            f"{n} x {p.name}, compute capability {cc}, {p.total_memory / 2**30:.1f} GiB, "
            f"driver {driver or 'unknown (' + smi_err + ')'}, torch CUDA {torch.version.cuda}"
        )
        details = {"count": n, "name": p.name, "capability": cc, "driver": driver}
        if (p.major, p.minor) < (7, 0):
            return Check(
                "gpu",
                "warn",
                ev,
                "Triton and Inductor need compute capability 7.0+; use a newer GPU for "
                "compiled variants.",
                details,
            )
        return Check("gpu", "ok", ev, details=details)
    if not torch.version.cuda:
        return Check(
            "gpu",
            "warn",
            "CPU-only torch build: GPU variants will be reported unsupported",
            "If this machine has an NVIDIA GPU, install a CUDA build of torch.",
        )
    if smi_rows:
        return Check(
            "gpu",
            "fail",
            f"nvidia-smi sees {smi_rows[0]}, but torch (CUDA {torch.version.cuda}) cannot use it",
            f"Update the NVIDIA driver to one that supports CUDA {torch.version.cuda}, or "
            "install a torch build for the CUDA version the driver supports.",
        )
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    extra = f", CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
    return Check(
        "gpu",
        "warn",
        f"no GPU visible (torch CUDA {torch.version.cuda} build; {smi_err}{extra}): "
        "CPU only, GPU variants will be reported unsupported",
        "For GPU numbers run on a machine with an NVIDIA GPU; if this one has one, check that "
        "nvidia-smi lists it and that CUDA_VISIBLE_DEVICES does not hide it.",
    )


def _expected_triton() -> tuple[str | None, str | None]:
    """(requirement spec, distribution name) torch's own metadata pins Triton to, if any."""
    try:
        requires = md.requires("torch") or []
    except md.PackageNotFoundError:
        return None, None
    for req in requires:
        m = re.match(r"^\s*((?:pytorch-)?triton)\s*([<>=!~][^;]*)", req)
        if m:
            return m.group(2).strip(), m.group(1)
    return None, None


def _satisfies(version: str, spec: str) -> bool:
    try:
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        return Version(version.split("+")[0]) in SpecifierSet(spec)
    except ImportError:
        # Without `packaging`: compare major.minor with the first version in the spec.
        want = _version_tuple(spec)[:2]
        return _version_tuple(version)[:2] == want


def check_triton(has_gpu: bool) -> Check:
    spec, dist = _expected_triton()
    installed = None
    for name in ("triton", "pytorch-triton"):
        try:
            installed = md.version(name)
            break
        except md.PackageNotFoundError:
            continue
    details: dict[str, Any] = {"installed": installed, "torch_requires": spec, "importable": False}
    if installed is None:
        status = "fail" if has_gpu else "warn"
        return Check(
            "triton",
            status,
            "triton is not installed" + (f" (torch requires {dist}{spec})" if spec else ""),
            f"pip install '{dist or 'triton'}{spec or ''}'",
            details,
        )
    try:
        import triton  # noqa: F401  (importable is what Inductor needs)
    except ImportError as exc:
        return Check(
            "triton",
            "fail",
            f"triton {installed} is installed but import fails: {exc}",
            "Reinstall the Triton version torch requires: "
            f"pip install --force-reinstall '{dist or 'triton'}{spec or ''}'.",
            details,
        )
    details["importable"] = True
    if spec is None:
        return Check(
            "triton",
            "ok",
            f"triton {installed}; this torch build does not pin a Triton version",
            details=details,
        )
    if not _satisfies(installed, spec):
        return Check(
            "triton",
            "fail",
            f"triton {installed}, but this torch requires {dist}{spec}",
            f"pip install '{dist}{spec}' (a mismatched Triton breaks Inductor's GPU codegen).",
            details,
        )
    return Check(
        "triton", "ok", f"triton {installed} (torch requires {dist}{spec})", details=details
    )


def _cxx() -> str | None:
    for cand in (os.environ.get("CXX"), "g++", "clang++", "c++"):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    return None


def check_cxx(has_gpu: bool) -> Check:
    """Inductor's CPU backend compiles C++ with OpenMP (on a GPU machine too, for CPU ops)."""
    severity = "warn" if has_gpu else "fail"
    cxx = _cxx()
    if cxx is None:
        return Check(
            "cxx-compiler",
            severity,
            "no C++ compiler found (looked for $CXX, g++, clang++, c++)",
            "Install a C++ compiler (e.g. apt-get install g++) so Inductor can compile CPU code.",
        )
    _, version = _run([cxx, "--version"])
    version_line = version.splitlines()[0] if version else "version unknown"
    with tempfile.TemporaryDirectory(prefix="kiln-doctor-") as tmp:
        src = Path(tmp) / "omp.cpp"
        src.write_text(
            "#include <omp.h>\nint main() { int n = 0;\n#pragma omp parallel reduction(+:n)\n"
            "n += 1;\nreturn n > 0 ? 0 : 1; }\n"
        )
        code, out = _run([cxx, "-fopenmp", str(src), "-o", str(Path(tmp) / "omp")], timeout=30)
        ran = _run([str(Path(tmp) / "omp")])[0] if code == 0 else None
    ev = f"{cxx}: {version_line}"
    if code != 0 or ran != 0:
        why = out.splitlines()[-1] if out else f"exit {code}"
        return Check(
            "cxx-compiler",
            severity,
            f"{ev}; building an OpenMP program failed: {why}",
            "Install OpenMP for this compiler (e.g. apt-get install libgomp1, or libomp on macOS).",
        )
    return Check("cxx-compiler", "ok", f"{ev}; OpenMP works")


def cache_dirs() -> dict[str, str]:
    """Where Inductor and Triton will write, resolved as torch resolves them."""
    inductor = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if inductor is None:
        try:
            from torch._inductor.runtime.cache_dir_utils import default_cache_dir

            inductor = default_cache_dir()
        except ImportError:  # older layout: torch's documented default
            import getpass

            inductor = os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
    triton = os.environ.get("TRITON_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".triton", "cache"
    )
    return {"TORCHINDUCTOR_CACHE_DIR": os.path.abspath(inductor), "TRITON_CACHE_DIR": triton}


def _writable(path: str) -> str | None:
    """None if a file can be created in ``path`` (creating the directory if needed), else why."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".kiln-doctor-", delete=True) as fh:
            fh.write(b"ok")
            fh.flush()
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    return None


def check_cache_dirs() -> Check:
    dirs = cache_dirs()
    problems, notes = [], []
    for var, path in dirs.items():
        why = _writable(path)
        if why:
            problems.append((var, path, why))
            continue
        free = shutil.disk_usage(path).free / 2**30
        notes.append(f"{var}={path} writable, {free:.1f} GiB free")
        if free < MIN_FREE_GIB:
            problems.append((var, path, f"only {free:.2f} GiB free"))
    if problems:
        var, path, why = problems[0]
        ev = "; ".join([f"{v}={p} not usable ({w})" for v, p, w in problems] + notes)
        return Check(
            "cache-dir",
            "fail",
            ev,
            f"Point {var} at a writable directory with space "
            f"(e.g. export {var}=$HOME/.cache/{var.split('_')[0].lower()}) or fix {path}'s "
            "permissions.",
            {"dirs": dirs},
        )
    return Check("cache-dir", "ok", "; ".join(notes), details={"dirs": dirs})


# name -> (distribution, how to install it, what kiln uses it for)
EXTRAS = {
    "torchvision": ("torchvision", "pip install 'torchkiln[vision]'", "the resnet50 workload"),
    "transformers": ("transformers", "pip install 'torchkiln[nlp]'", "the bert-base workload"),
    "jax": ("jax", "pip install jax", "the xla variant (with torchax)"),
    "torchax": ("torchax", "pip install torchax", "the xla variant"),
    "tlparse": ("tlparse", "pip install tlparse", "the HTML report of `kiln explain --trace`"),
}


def check_extra(name: str) -> Check:
    dist, install, used_for = EXTRAS[name]
    try:
        version = md.version(dist)
    except md.PackageNotFoundError:
        version = None
    if version is None and name == "tlparse" and shutil.which("tlparse"):
        _, out = _run(["tlparse", "--version"])
        version = out.split()[-1] if out else "on PATH"
    if version is None:
        return Check(f"extra:{name}", "info", f"not installed (used by {used_for})", install)
    return Check(f"extra:{name}", "ok", f"{name} {version} (used by {used_for})")
