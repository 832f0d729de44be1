"""Ctrl-C while the workload loads: the hint names the run directory, and --resume on it works;
the wait for the workload shows its limit."""

from __future__ import annotations

import torchkiln.api as api
from torchkiln.cli import main
from torchkiln.runner.store.rundir import RunDir


def test_a_run_stopped_while_the_workload_loads_resumes(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "preflight", interrupted)
    assert main(["bench", "simple", "--device", "cpu", "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert f"run directory {out}" in err and f"--resume {out}" in err
    assert RunDir(out).manifest() is not None

    seen = []

    def refuses(spec, work_dir, timeout_s):
        seen.append(timeout_s)
        return {"ok": False, "message": "planted refusal"}

    monkeypatch.setattr(api, "preflight", refuses)
    assert main(["bench", "simple", "--device", "cpu", "--resume", str(out)]) == 2
    err = capsys.readouterr().err
    assert "planted refusal" in err and "no manifest.json" not in err
    assert seen and out.is_dir()  # reached the workload; a resumed directory is kept


def test_a_refused_workload_leaves_no_run_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(api, "preflight", lambda *a: {"ok": False, "message": "planted"})
    out = tmp_path / "run"
    assert main(["bench", "simple", "--device", "cpu", "--out", str(out)]) == 2
    assert not out.exists()


def test_the_progress_shows_the_wait_for_the_workload_and_its_limit(monkeypatch):
    from torchkiln.cli import _Progress

    progress = _Progress(2)
    progress.preflight(900.0)
    (task,) = progress.progress.tasks
    assert "loading the workload" in task.description and "limit 900 s" in task.description
