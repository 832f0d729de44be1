"""A run directory: one JSON per trial written as soon as it ends, plus a manifest, so a killed
run loses nothing and `--resume DIR` skips what is done (only results measured the same way:
reuse.py)."""

from __future__ import annotations

import json
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

    def trial_dir(self, trial_id: str) -> Path:
        return self.trials_dir / trial_id

    def result_path(self, trial_id: str) -> Path:
        return self.trial_dir(trial_id) / "result.json"

    def load_result(self, trial_id: str) -> dict[str, Any] | None:
        path = self.result_path(trial_id)
        if not path.exists():
            return None
        return json.loads(path.read_text())

    def reusable(self, spec: TrialSpec) -> tuple[dict[str, Any] | None, str | None]:
        """The finished result of ``spec``'s trial if it was measured the same way (reuse.py),
        else None and, where a result was there, why it is not reused."""
        done = self.load_result(spec.id)
        if done is None:
            return None, None
        key_path = self.trial_dir(spec.id) / REUSE_KEY
        stored = json.loads(key_path.read_text()) if key_path.exists() else None
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
        return json.loads(self.manifest_path.read_text())

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
