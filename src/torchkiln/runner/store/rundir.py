"""A run directory: one JSON per trial written as soon as it ends, plus a manifest, so a killed
run loses nothing and `--resume DIR` skips what is done (only results measured the same way:
reuse.py)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from torchkiln.runner.protocol.trial import TrialSpec
from torchkiln.runner.protocol.worker import write_json
from torchkiln.runner.store.reuse import difference, fingerprint, retried

MANIFEST_SCHEMA = "torchkiln.run/1"
REUSE_KEY = "reuse-key.json"  # beside result.json: what the result was measured with


class RunDir:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.trials_dir = self.path / "trials"
        self.manifest_path = self.path / "manifest.json"
        self.set_aside: dict[str, str] = {}  # trial id -> why its result file was set aside

    def trial_dir(self, trial_id: str) -> Path:
        return self.trials_dir / trial_id

    def result_path(self, trial_id: str) -> Path:
        return self.trial_dir(trial_id) / "result.json"

    def load_result(self, trial_id: str) -> dict[str, Any] | None:
        """The trial's saved result; None where there is none, or where it is unreadable (cut
        mid-write, edited by hand): such a file is set aside with a warning and the trial is
        measured again, never a traceback that names no file."""
        path = self.result_path(trial_id)
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict) or not isinstance(data.get("status"), str):
                raise ValueError("not a trial result (no status)")
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            aside = path.with_name(f"result.unreadable-{time.strftime('%Y%m%d-%H%M%S')}.json")
            path.replace(aside)
            self.set_aside[trial_id] = f"{path} was unreadable ({exc}); set aside as {aside.name}"
            print(
                f"kiln: warning: {self.set_aside[trial_id]}; the trial is measured again",
                file=sys.stderr,
            )
            return None
        return data

    def reusable(self, spec: TrialSpec) -> tuple[dict[str, Any] | None, str | None]:
        """The finished result of ``spec``'s trial if it was measured the same way (reuse.py),
        else None and, where a result was there, why it is not reused."""
        done = self.load_result(spec.id)
        if done is None:
            aside = self.set_aside.get(spec.id)
            return None, None if aside is None else f"measured afresh: {aside}"
        key_path = self.trial_dir(spec.id) / REUSE_KEY
        try:
            stored = json.loads(key_path.read_text()) if key_path.exists() else None
        except (OSError, UnicodeDecodeError, ValueError):
            stored = None  # an unreadable record: as if it had none, so it is measured again
        why = retried(done) or difference(stored, fingerprint(spec))
        if why is None:
            return done, None
        left = f"the result an earlier run left in {self.path}"
        return None, f"measured afresh: {left} was not reused, as {why}"

    def save_result(
        self, trial_id: str, result: dict[str, Any], spec: TrialSpec | None = None
    ) -> None:
        """With ``spec``, also what the result was measured with, so a later run into this
        directory can reuse it (``reusable``); without, it is never reused."""
        self.trial_dir(trial_id).mkdir(parents=True, exist_ok=True)
        key_path = self.trial_dir(trial_id) / REUSE_KEY
        key_path.unlink(missing_ok=True)  # a result without its own key is never reused
        write_json(self.result_path(trial_id), result)
        if spec is not None:
            write_json(key_path, fingerprint(spec))

    def manifest(self) -> dict[str, Any] | None:
        if not self.manifest_path.exists():
            return None
        try:
            return json.loads(self.manifest_path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            from torchkiln.errors import KilnUserError

            raise KilnUserError(
                f"{self.manifest_path} is unreadable ({exc}); move it away to start the run "
                "afresh in this directory"
            ) from None

    def write_manifest(self, info: dict[str, Any], trial_ids: list[str]) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        trials = []
        for tid in trial_ids:
            res = self.load_result(tid)
            trials.append(
                {
                    "id": tid,
                    "status": res["status"] if res else "pending",
                    "file": str(self.result_path(tid).relative_to(self.path)) if res else None,
                }
            )
        write_json(
            self.manifest_path,
            {
                "schema": MANIFEST_SCHEMA,
                "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                **info,
                "trials": trials,
            },
        )
