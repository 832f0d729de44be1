"""Each source rewrite on its own fixture: the rewritten copy compiles with fewer graph breaks
(counted by Dynamo), computes what the original does from the same weights, and its patch
applies to a pristine copy of the user's files, which are never modified."""

from __future__ import annotations

import pytest
import torch

from repair.helpers import (
    compiles_whole,
    dynamo_breaks,
    kiln_breaks,
    patch_applies,
    project,
    sha256s,
)
from torchkiln.repair.arm import load_patched
from torchkiln.repair.loader import import_file
from torchkiln.repair.plan import build_plan

# fixture files, the rewrite that answers their breaks, Dynamo's breaks left after it
CASES = [
    (("encoder.py", "_encoder_blocks.py"), "guard", None),
    (("encoder.py", "_encoder_blocks.py"), "item", None),
    (("encoder.py", "_encoder_blocks.py"), "logging", None),
    (("encoder.py", "_encoder_blocks.py"), "all", 0),
    (("scaled_head.py",), "item", 0),
    (("printing_cnn.py",), "logging", 0),
    (("gated_mlp.py",), "where", 0),
    (("checked_mlp.py",), "assert", 0),
    (("bucket_embed.py",), "numpy", 0),
    (("smooth_net.py", "_smoothing.py"), "custom_op", 0),
]


def _original(entry):
    torch.manual_seed(0)
    return import_file(entry).build(preset="tiny")


@pytest.mark.parametrize(("files", "rewrite", "left"), CASES, ids=lambda c: str(c))
def test_rewrite_removes_breaks_keeps_outputs_and_patch_applies(tmp_path, files, rewrite, left):
    proj = project(tmp_path, *files)
    before = sha256s(proj)
    entry = proj / files[0]
    w = _original(entry)
    breaks = kiln_breaks(w.model, w.example_inputs)
    assert breaks, "the fixture must break"
    plan = build_plan(f"{entry}:build", breaks, tmp_path / "run", "code")
    key = rewrite if rewrite in plan["code"] else "all"
    applied = {a["rewrite"] for a in plan["code"][key]["applied"]}
    assert rewrite in applied or rewrite == "all"
    if rewrite != "all":
        assert applied == {rewrite}

    torch.manual_seed(0)
    patched = load_patched(key, plan, preset="tiny")
    patched.model.load_state_dict(w.model.state_dict())
    w.model.eval(), patched.model.eval()
    with torch.no_grad():
        want = w.model(*w.example_inputs)
        got = patched.model(*w.example_inputs)
    torch.testing.assert_close(got, want)

    assert dynamo_breaks(w.model, w.example_inputs) != (0, 1)  # the original breaks
    if left == 0:
        assert compiles_whole(patched.model, w.example_inputs)
        assert dynamo_breaks(patched.model, w.example_inputs) == (0, 1)
    else:
        # Fewer pieces: Dynamo's counted breaks plus the graphs between them.
        assert sum(dynamo_breaks(patched.model, w.example_inputs)) < sum(
            dynamo_breaks(w.model, w.example_inputs)
        )

    patch_file = tmp_path / "run" / f"code-{key}.patch"
    assert patch_file.read_text().startswith("diff --git a/")
    patch_applies(patch_file, {f: proj / f for f in files}, tmp_path)
    assert sha256s(proj) == before  # the user's files untouched
