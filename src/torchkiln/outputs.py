"""Output paths checked before any work: a run directory, a JSON file or a trace directory
kiln cannot write ends the command at once (exit 2, one line), not after the last trial with a
traceback. Nothing is created here: a refused command leaves no directory behind."""

from __future__ import annotations

import tempfile
from pathlib import Path

from torchkiln.errors import KilnUserError


def _nearest_existing(path: Path) -> Path:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def _writable_dir(option: str, given: str, where: Path) -> None:
    """Tried, not guessed from permission bits: root may write anywhere but into /proc."""
    if not where.is_dir():
        raise KilnUserError(
            f"{option} {given!r}: {str(where)!r} is a file, so nothing can be written under "
            "it; give a path in a directory you can write to"
        )
    try:
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError as exc:
        raise KilnUserError(
            f"{option} {given!r}: cannot write in {str(where)!r} ({exc.strerror or exc}); "
            "give a path in a directory you can write to"
        ) from None


def check_output_dir(option: str, path: str | Path | None) -> None:
    """A directory kiln will create (with its parents) or write into."""
    if path is None:
        return
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise KilnUserError(f"{option} {str(path)!r}: it is a file, not a directory")
    _writable_dir(option, str(path), _nearest_existing(target))


def check_output_file(option: str, path: str | Path | None) -> None:
    """A file kiln will write (its parent directories made as needed); '-' is stdout."""
    if path is None or str(path) == "-":
        return
    target = Path(path)
    if target.is_dir():
        raise KilnUserError(f"{option} {str(path)!r}: it is a directory, not a file")
    _writable_dir(option, str(path), _nearest_existing(target.parent))
