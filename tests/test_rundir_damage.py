"""A damaged file in a run directory is set aside with a warning naming it, not a traceback."""

from __future__ import annotations

import json

import pytest

from torchkiln.errors import KilnUserError
from torchkiln.runner.protocol.trial import TrialSpec
from torchkiln.runner.store.rundir import RunDir


@pytest.mark.parametrize("text", ['{"status": "ok", "steady', "[1, 2, 3]", "7", '{"a": 1}', ""])
def test_an_unreadable_result_is_set_aside_and_measured_again(tmp_path, capsys, text):
    run = RunDir(tmp_path)
    spec = TrialSpec(workload="simple", variant="eager")
    run.save_result(spec.id, {"status": "ok", "variant": "eager"}, spec)
    run.result_path(spec.id).write_text(text)
    done, why = run.reusable(spec)
    assert done is None
    assert "was unreadable" in why and "set aside as result.unreadable-" in why
    err = capsys.readouterr().err
    assert str(run.result_path(spec.id)) in err and "measured again" in err
    assert not run.result_path(spec.id).exists()
    (aside,) = run.trial_dir(spec.id).glob("result.unreadable-*.json")
    assert aside.read_text() == text  # kept as it was, for the user to look at
    run.write_manifest({}, [spec.id])  # the manifest sees a pending trial
    manifest = json.loads(run.manifest_path.read_text())
    assert manifest["trials"][0]["status"] == "pending"


def test_an_unreadable_reuse_record_means_measured_again(tmp_path):
    run = RunDir(tmp_path)
    spec = TrialSpec(workload="simple", variant="eager")
    run.save_result(spec.id, {"status": "ok", "variant": "eager"}, spec)
    (run.trial_dir(spec.id) / "reuse-key.json").write_text("{not json")
    done, why = run.reusable(spec)
    assert done is None and "no record of how it was measured" in why


def test_an_unreadable_manifest_names_the_file(tmp_path):
    run = RunDir(tmp_path)
    run.manifest_path.write_text("{")
    with pytest.raises(KilnUserError, match="manifest.json is unreadable"):
        run.manifest()
