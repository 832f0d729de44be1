"""Where a trial's compile cache lives, and the path the compilers are given for it.

A trial's cache is fresh unless the user shares one (`--cache-dir`): a trial measured again
after an interrupted run starts from an empty cache, so its compile time is one it paid (a
resumed `simple` tune on 2 CPU cores read 2.9 s first call from the killed trial's leftover
cache, against 20-25 s cold).

Inductor's C++ backend builds its compiler command as one string split at spaces: a cache under
`runs/x y` fails with "g++: fatal error: input file ... is the same as output file". A cache
whose real path has any character outside a plain set is reached through a symlink of a plain
name in the system's temporary directory; the result records both.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_PLAIN = re.compile(r"[A-Za-z0-9_./+=-]*")


def is_plain(path: str | Path) -> bool:
    """True where every compiler kiln drives takes the path as it is."""
    return _PLAIN.fullmatch(str(path)) is not None


@dataclass(frozen=True)
class CompileCache:
    """``real``: the directory holding the cache; ``given``: the path handed to the compilers
    (``real`` itself, or a plain-named symlink to it); ``fresh``: kiln made it for one trial
    and removes it when the trial ends."""

    real: Path
    given: Path
    fresh: bool

    def remove(self, keep: bool = False) -> None:
        """The symlink, if any, and a fresh cache itself unless ``keep`` (to be lent to a later
        trial; its owner removes it, see ``drop``)."""
        if self.given != self.real and self.given.is_symlink():
            self.given.unlink(missing_ok=True)
        if self.fresh and not keep:
            shutil.rmtree(self.real, ignore_errors=True)


def prepare(trial_dir: Path, cache_dir: str | None) -> CompileCache:
    """The trial's cache: ``cache_dir`` as the user gave it (kept), else an empty
    ``trial_dir/compile-cache`` (whatever an earlier, interrupted measurement left there is
    removed first)."""
    if cache_dir:
        real = Path(cache_dir).resolve()
        real.mkdir(parents=True, exist_ok=True)
        return CompileCache(real, _reachable(real), fresh=False)
    real = kept(trial_dir)
    shutil.rmtree(real, ignore_errors=True)
    real.mkdir(parents=True)
    return CompileCache(real, _reachable(real), fresh=True)


def _reachable(real: Path) -> Path:
    if is_plain(real):
        return real
    digest = hashlib.sha256(str(real).encode()).hexdigest()[:16]
    link = Path(tempfile.gettempdir()).resolve() / f"kiln-cache-{digest}"
    if link.is_symlink() and os.readlink(link) == str(real):
        return link
    tmp = link.with_name(f"{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(real, tmp)
    os.replace(tmp, link)  # a stale link (or one from an older run) is swapped in one step
    return link


def lend(cache: CompileCache, sources: dict[str, Path]) -> dict[str, Any]:
    """Copy the kept caches of finished trials (``sources``: trial id -> its cache directory)
    into ``cache``, fresh and empty: a trial that times variants already measured (a tune's
    head-to-head) then loads their compiled code instead of compiling it again. Its first call
    is then no cold compile, and the record says whose caches it was lent. A source that is
    gone (a trial reused from an earlier run, whose cache went with that run) is left out."""
    lent, size = [], 0
    for trial_id, src in sources.items():
        if not src.is_dir():
            continue
        shutil.copytree(src, cache.real, symlinks=True, dirs_exist_ok=True)
        lent.append(trial_id)
        size += sum(f.stat().st_size for f in src.rglob("*") if f.is_file())
    return {"lent_from": lent, "bytes": size}


def kept(trial_dir: Path) -> Path:
    """Where a trial run with ``keep_cache`` left its fresh cache."""
    return (Path(trial_dir) / "compile-cache").resolve()


def drop(trial_dirs: list[Path]) -> None:
    """Remove the caches trials kept (the tune's end; a stopped tune leaves them, and a trial
    measured again into the same directory starts from an empty one all the same)."""
    for d in trial_dirs:
        shutil.rmtree(kept(d), ignore_errors=True)
