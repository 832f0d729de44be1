"""The command-line conventions a CI script leans on: stdout for `-`, `--debug` anywhere, an
exit code when every trial failed, whole help texts, one default per option."""

from __future__ import annotations

import argparse
import io
import json

import pytest

import torchkiln.api as api
from torchkiln import defaults
from torchkiln.cli import build_parser, main
from torchkiln.cli_args import failed_exit


def _fake_bench(statuses):
    def bench(workload, variants, **kwargs):
        return {
            "workload": workload, "step": "infer", "device": "cpu", "preset": "tiny",
            "baseline": "eager", "environment": None, "run_dir": kwargs["out"],
            "trials": [
                {"variant": v, "status": s} for v, s in zip(variants, statuses, strict=True)
            ],
        }  # fmt: skip

    return bench


def test_bench_json_dash_writes_the_document_to_stdout(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(api, "bench", _fake_bench(["ok", "ok"]))
    code = main(["bench", "simple", "--device", "cpu", "--variants", "eager,inductor",
                 "--json", "-", "--out", "run"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert [t["variant"] for t in json.loads(out)["trials"]] == ["eager", "inductor"]
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize(
    ("statuses", "fail_on", "code"),
    [
        (["compile_error", "timeout"], "all", 1),
        (["ok", "timeout"], "all", 0),
        (["ok", "timeout"], "any", 1),
        (["compile_error", "timeout"], "never", 0),
        (["ok", "ok"], "any", 0),
    ],
)
def test_bench_exits_1_when_trials_failed_as_fail_on_says(
    statuses, fail_on, code, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(api, "bench", _fake_bench(statuses))
    argv = ["bench", "simple", "--device", "cpu", "--variants", "eager,inductor", "--out", "r"]
    assert main([*argv, "--fail-on", fail_on]) == code
    err = capsys.readouterr().err
    assert ("failed:" in err) == bool(code)


def test_fail_on_defaults_to_all_and_is_documented():
    assert build_parser().parse_args(["bench", "simple"]).fail_on == "all"
    assert failed_exit([{"status": "oom"}], "all") == 1
    helptext = _help(["bench"])
    assert "--fail-on" in helptext and "every trial failed" in helptext


def test_debug_is_taken_after_the_subcommand_too():
    parser = build_parser()
    assert parser.parse_args(["tune", "nosuch", "--debug"]).debug is True
    assert parser.parse_args(["--debug", "tune", "nosuch"]).debug is True
    assert parser.parse_args(["tune", "nosuch"]).debug is False
    assert parser.parse_args(["kernels", "bench", "--debug"]).debug is True


def test_debug_after_the_subcommand_shows_the_traceback():
    from torchkiln.errors import KilnUserError

    with pytest.raises(KilnUserError, match="unknown workload"):
        main(["tune", "nosuch", "--device", "cpu", "--debug"])


def test_a_bad_variant_is_refused_before_the_progress_bar(monkeypatch, capsys, tmp_path):
    import torchkiln.cli as cli

    def no_progress(*a, **k):
        raise AssertionError("the progress bar started")

    monkeypatch.setattr(cli, "_Progress", no_progress)
    assert main(["bench", "simple", "--variants", "eager,inductor:mode=fast"]) == 2
    assert "mode='fast'" in capsys.readouterr().err


def _help(argv):
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices[argv[0]]
    return sub.format_help()


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ("explain", "recompilations over several shapes, CUDA-graph skips; runs Dynamo"),
        ("doctor", "Exit code 1 when any check fails"),
        ("serve-bench", "BucketedModule (powers of two, learned)"),
    ],
)
def test_help_texts_use_the_whole_first_paragraph(command, words):
    assert words in " ".join(_help([command]).split())


def test_tune_help_explains_every_option():
    text = " ".join(_help(["tune"]).split())
    for words in (
        "a registered name (see `kiln workloads`)",  # workload
        "a forward, backward and optimizer step",  # --step
        "the workload's batch size",  # --batch-size
        "paired timed reps per trial",  # --reps
    ):
        assert words in text


def test_piped_output_is_not_folded_at_80_columns(monkeypatch):
    from torchkiln.console import make_console

    monkeypatch.delenv("COLUMNS", raising=False)
    console = make_console(file=io.StringIO())
    long = "word " * 40
    console.print(long)
    assert console.file.getvalue().count("\n") == 1


def test_the_bench_table_takes_its_natural_width(monkeypatch, capsys):
    from torchkiln.report.table import render

    monkeypatch.delenv("COLUMNS", raising=False)
    doc = {"workload": "w", "step": "infer", "device": "cpu", "preset": "tiny",
           "baseline": "eager", "trials": [], "run_dir": "r", "environment": None}  # fmt: skip
    render(doc)
    widths = [len(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert max(widths) < 220


def test_one_default_per_option_across_commands_and_the_api():
    import inspect

    from torchkiln.diagnose.explain import explain
    from torchkiln.diagnose.profile import run_profile
    from torchkiln.tune.api import tune

    parser = build_parser()
    for argv in (["bench", "simple"], ["tune"], ["explain", "simple"], ["profile", "simple"],
                 ["serve-bench", "simple", "--trace", "t"]):  # fmt: skip
        args = parser.parse_args(argv)
        assert args.preset == defaults.PRESET and args.device is None, argv
    for fn in (tune, explain, run_profile):
        params = inspect.signature(fn).parameters
        assert params["preset"].default == defaults.PRESET, fn
        assert params["device"].default is None, fn
    assert inspect.signature(tune).parameters["budget"].default == defaults.BUDGET
    assert defaults.budget("auto", "cpu") == "4m" and defaults.budget("auto", "cuda") == "15m"
    assert defaults.preset("auto", "cpu") == "tiny" and defaults.preset("auto", "cuda:1") == "full"
    assert isinstance(parser.parse_args(["tune"]), argparse.Namespace)
