"""`kiln doctor`: every check reported with a status, failures with a remedy, exit code 1."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
from pathlib import Path

import pytest

from torchkiln.diagnose import doctor
from torchkiln.diagnose.doctor_checks import STATUSES, Check, check_cache_dirs

EXPECTED_CHECKS = [
    "python",
    "torch",
    "gpu",
    "triton",
    "triton-kernel",
    "cxx-compiler",
    "inductor",
    "cache-dir",
    "extra:torchvision",
    "extra:transformers",
    "extra:jax",
    "extra:torchax",
    "extra:tlparse",
]


def _unwritable_dir(tmp: Path) -> str:
    # A directory "inside" a regular file cannot be created even by root (chmod would not stop
    # root, and CI containers often run as root).
    blocker = tmp / "not-a-dir"
    blocker.write_text("a file, not a directory")
    return str(blocker / "inductor-cache")


@pytest.fixture(scope="module")
def doctor_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict, str]:
    """One full doctor run (its probes compile for real: ~25 s on 2 cores), shared by the tests."""
    tmp = tmp_path_factory.mktemp("doctor")
    bad = _unwritable_dir(tmp)
    parser = argparse.ArgumentParser()
    doctor.add_arguments(parser)
    out = tmp / "doctor.json"
    args = parser.parse_args(["--json", str(out), "--timeout", "150"])
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = bad
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            code = doctor.run(args)
    finally:
        if old is None:
            del os.environ["TORCHINDUCTOR_CACHE_DIR"]
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = old
    return code, json.loads(out.read_text()), buf.getvalue()


def test_json_lists_every_check_with_a_status(doctor_run: tuple[int, dict, str]) -> None:
    _, report, _ = doctor_run
    assert report["schema"] == "kiln.doctor/1"
    assert [c["name"] for c in report["checks"]] == EXPECTED_CHECKS
    for c in report["checks"]:
        assert c["status"] in STATUSES, c
        assert c["evidence"], c
        if c["status"] != "ok":
            assert c["remedy"], f"{c['name']} is {c['status']} without a remedy"
    assert sum(report["counts"].values()) == len(EXPECTED_CHECKS)


def test_unwritable_cache_dir_fails_with_its_remedy(doctor_run: tuple[int, dict, str]) -> None:
    code, report, text = doctor_run
    cache = next(c for c in report["checks"] if c["name"] == "cache-dir")
    assert cache["status"] == "fail"
    assert "not-a-dir" in cache["evidence"]
    assert "TORCHINDUCTOR_CACHE_DIR" in cache["remedy"]
    assert code == 1  # any fail -> exit 1
    assert report["status"] == "fail"
    assert "cache-dir" in text and "fail" in text  # the human table shows it too


def test_compile_probes_ran_for_real(doctor_run: tuple[int, dict, str]) -> None:
    _, report, _ = doctor_run
    by_name = {c["name"]: c for c in report["checks"]}
    # The Inductor probe uses its own fresh cache, so the bad cache dir above does not touch it.
    assert by_name["inductor"]["status"] == "ok", by_name["inductor"]
    assert "matches eager" in by_name["inductor"]["evidence"]
    if by_name["triton"]["status"] == "ok":
        assert by_name["triton-kernel"]["status"] == "ok", by_name["triton-kernel"]
    # On a machine without a GPU the GPU check says so, and never fails for it.
    if by_name["gpu"]["status"] != "ok":
        assert by_name["gpu"]["status"] in ("warn", "fail")


def test_cache_check_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "ok"))
    monkeypatch.setenv("TRITON_CACHE_DIR", _unwritable_dir(tmp_path))
    check = check_cache_dirs()
    assert check.status == "fail"
    assert "TRITON_CACHE_DIR" in check.remedy
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    check = check_cache_dirs()
    assert check.status == "ok" and check.remedy == ""
    assert (tmp_path / "ok").is_dir() and (tmp_path / "triton").is_dir()


def test_probe_that_crashes_or_hangs_becomes_a_status() -> None:
    crashed = doctor._probe("inductor", "no-such-probe", {}, timeout=60)
    assert crashed.status == "fail" and "exited with code 2" in crashed.evidence
    hung = doctor._probe("inductor", "inductor", {}, timeout=0.5)
    assert hung.status == "warn" and "did not finish within" in hung.evidence
    assert "--timeout" in hung.remedy


def test_check_rejects_an_unknown_status() -> None:
    with pytest.raises(ValueError, match="choose from"):
        Check("x", "maybe", "evidence")
