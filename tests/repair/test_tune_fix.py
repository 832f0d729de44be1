"""`kiln tune --fix` end to end on the CPU, and its bad input: an unknown --fix value, a
workload file that vanished before the rewrite. The user's files are never modified."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from repair.helpers import kiln_breaks, project, sha256s
from torchkiln.cli import main
from torchkiln.errors import KilnUserError
from torchkiln.repair.loader import import_file
from torchkiln.repair.plan import build_plan


def kiln(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchkiln.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=900,
    )


def test_an_unknown_fix_value_is_one_line_and_exit_2(tmp_path, capsys):
    proj = project(tmp_path, "scaled_head.py")
    before = sha256s(proj)
    code = main(["tune", f"{proj / 'scaled_head.py'}:build", "--fix", "everything", "--device",
                 "cpu", "--out", str(tmp_path / "run")])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1
    assert "--fix 'everything'; choose from ['none', 'config', 'code']" in err
    assert sha256s(proj) == before


def test_an_unknown_remedy_in_a_variant_spec_lists_the_choices():
    from torchkiln.variants import VariantSpecError, parse_variant

    with pytest.raises(VariantSpecError, match="choose from fix="):
        parse_variant("inductor+fix=code:everything")
    v = parse_variant("inductor:mode=reduce-overhead+bf16+fix=config:capture_scalar_outputs")
    assert parse_variant(v.spec) == v
    assert v.spec == "inductor:mode=reduce-overhead+bf16+fix=config:capture_scalar_outputs"


def test_a_file_that_vanished_before_the_rewrite_is_a_user_error(tmp_path):
    import torch

    proj = project(tmp_path, "smooth_net.py", "_smoothing.py")
    torch.manual_seed(0)
    w = import_file(proj / "smooth_net.py").build(preset="tiny")
    breaks = kiln_breaks(w.model, w.example_inputs)
    (proj / "_smoothing.py").unlink()  # between explain and the rewrite
    before = sha256s(proj)
    with pytest.raises(KilnUserError, match="vanished") as info:
        build_plan(f"{proj / 'smooth_net.py'}:build", breaks, tmp_path / "run")
    assert "\n" not in str(info.value)
    assert sha256s(proj) == before


def test_a_read_only_project_is_rewritten_in_a_copy_and_left_as_it_was(tmp_path):
    import torch

    proj = project(tmp_path, "scaled_head.py")
    entry = proj / "scaled_head.py"
    torch.manual_seed(0)
    w = import_file(entry).build(preset="tiny")
    breaks = kiln_breaks(w.model, w.example_inputs)
    entry.chmod(0o444)
    proj.chmod(0o555)
    before = sha256s(proj)
    try:
        plan = build_plan(f"{entry}:build", breaks, tmp_path / "run")
    finally:
        proj.chmod(0o755)
    assert plan["code"]["all"]["applied"][0]["rewrite"] == "item"
    assert sha256s(proj) == before


@pytest.mark.slow
def test_kiln_tune_on_a_zoo_model_ships_a_patch_that_explain_passes(tmp_path):
    proj = project(tmp_path, "encoder.py", "_encoder_blocks.py")
    before = sha256s(proj)
    out = tmp_path / "run"
    r = kiln("tune", f"{proj / 'encoder.py'}:build", "--device", "cpu", "--preset", "tiny",
             "--budget", "8m", "--reps", "3", "--out", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert sha256s(proj) == before
    doc = json.loads((out / "results.json").read_text())
    combined = next(
        t for t in doc["trials"] if t["variant"] == "inductor:dynamic=false+fix=code:all"
    )
    assert combined["status"] == "ok" and combined["correctness"]["passed"]
    assert combined["repair"]["graph_breaks_after"] == 0
    md = (out / "report.md").read_text()
    assert "What each graph break costs" in md
    pick = doc["selection"]["best"]
    patch = out / "fixes.patch"

    def explain_patched(name: str, diff: Path) -> int:
        applied = tmp_path / name
        shutil.copytree(proj, applied)
        p = subprocess.run(["patch", "-p1", "-i", str(diff)], cwd=applied, capture_output=True)
        assert p.returncode == 0, p.stdout
        check = kiln("explain", f"{applied / 'encoder.py'}:build", "--preset", "tiny",
                     "--no-recompiles", "--fullgraph-check")  # fmt: skip
        return check.returncode

    if "+fix=code" in pick:
        # The pick ships its patch: in the run directory, in both reports; applied, the source
        # has the graph breaks the pick's trial counted (0 for the combined remedy; a single
        # rewrite can win on a host where the candidates time alike, and leaves the rest).
        assert patch.exists()
        assert "## Remedies in the pick" in md and "```diff" in md
        assert "fixes.patch" in (out / "report.html").read_text()
        after = next(t for t in doc["trials"] if t["variant"] == pick)["repair"]
        assert explain_patched("picked", patch) == (0 if after["graph_breaks_after"] == 0 else 1)
    else:
        # Timing decided against the remedy on this host: its patch is still in the plan.
        assert not patch.exists()
    # The plan's combined patch removes every break, whichever candidate won.
    assert explain_patched("combined", out / "repair" / "code-all.patch") == 0
    original = kiln("explain", f"{proj / 'encoder.py'}:build", "--preset", "tiny",
                    "--no-recompiles", "--fullgraph-check")  # fmt: skip
    assert original.returncode == 1


@pytest.mark.slow
def test_explain_fix_prints_the_patch_and_touches_nothing(tmp_path):
    proj = project(tmp_path, "gated_mlp.py")
    before = sha256s(proj)
    r = kiln("explain", f"{proj / 'gated_mlp.py'}:build", "--preset", "tiny", "--no-recompiles",
             "--fix")  # fmt: skip
    assert r.stdout.startswith("diff --git a/gated_mlp.py b/gated_mlp.py"), r.stderr[-2000:]
    assert "torch.where(h.mean() > 0, torch.relu(h), torch.tanh(h))" in r.stdout
    assert "[where]" in r.stderr
    assert sha256s(proj) == before
    (tmp_path / "fix.patch").write_text(r.stdout)
    g = subprocess.run(["git", "apply", "--check", str(tmp_path / "fix.patch")], cwd=proj,
                       capture_output=True, text=True)  # fmt: skip
    assert g.returncode == 0, g.stderr
