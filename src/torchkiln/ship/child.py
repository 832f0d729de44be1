"""The shape of kiln ship's child processes (`build`, `probe`): ``JOB.json RESULT.json`` in, a
result with ``ok`` out, every failure reported with its reason for the parent."""

from __future__ import annotations

import faulthandler
import json
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


def child_main(
    argv: list[str],
    work: Callable[[dict[str, Any]], dict[str, Any]],
    on_error: Callable[[dict[str, Any]], dict[str, Any]] = lambda job: {},
) -> int:
    """Runs ``work`` on the job and writes its result; a failure becomes ``ok: false`` with the
    error, its traceback's tail and ``on_error(job)``'s fields."""
    job_path, result_path = argv
    from torchkiln.runner.launch.orphan import exit_with_launcher
    from torchkiln.runner.protocol.worker import write_json

    exit_with_launcher()
    # A crash in native code (a segfault in a package load) leaves its Python stack on stderr,
    # whose tail the parent reports.
    faulthandler.enable()
    job = json.loads(Path(job_path).read_text())
    try:
        result = {"ok": True, **work(job)}
    except Exception as exc:  # noqa: BLE001  (the parent reports it with its reason)
        result = {
            "ok": False,
            **on_error(job),
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc()[-4000:],
        }
    write_json(result_path, result)
    return 0
