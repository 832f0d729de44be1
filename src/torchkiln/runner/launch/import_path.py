"""A trial process imports what its caller could: the caller's sys.path travels on PYTHONPATH.

A user's script that keeps its model class in a module beside it (what kiln's warning about
`__main__` advises) imports it through the script's directory, which Python put on the
script's sys.path only; a trial process started with `python -m` would not see it and fail
with ModuleNotFoundError unless the user set PYTHONPATH by hand.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path


def _interpreter_dirs() -> set[str]:
    """The stdlib and site-packages directories, which the child finds by itself."""
    paths = sysconfig.get_paths()
    return {str(Path(paths[k]).resolve()) for k in ("stdlib", "platstdlib", "purelib", "platlib")}


def caller_path(existing: str | None) -> str:
    """PYTHONPATH for a child: the caller's own sys.path entries first, in order (the current
    directory as its absolute path, the interpreter's own directories left out), then what
    PYTHONPATH held already."""
    own = _interpreter_dirs()
    entries: list[str] = []
    for entry in sys.path:
        path = str(Path(entry or os.getcwd()).resolve())
        if path in own or path in entries or not Path(path).is_dir():
            continue
        if any(part.endswith((".zip", ".egg")) for part in Path(path).parts):
            continue
        entries.append(path)
    for entry in filter(None, (existing or "").split(os.pathsep)):
        if entry not in entries:
            entries.append(entry)
    return os.pathsep.join(entries)
