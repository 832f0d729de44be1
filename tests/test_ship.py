"""`kiln ship` and `torchkiln.load`: a tiny MLP shipped on Inductor's C++ backend, its routes
measured in fresh processes, and the manifest's checks (environment, model, artifact bytes)."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import warnings
from pathlib import Path

import pytest

from tests_helpers import _trial, synthetic_tune_doc
from torchkiln.cli import main

MLP = str(Path(__file__).parent / "fixtures" / "ship_mlp.py") + ":mlp"


def _run_dir(path: Path, best: str | None = "inductor", passed: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    doc = synthetic_tune_doc()
    trial = _trial("inductor", 1.0, 1.5, 2.0)
    trial["correctness"]["passed"] = passed
    doc.update(workload=MLP, preset="tiny", device="cpu", step="infer", trials=[trial])
    doc["selection"] = {**doc["selection"], "best": best}
    doc["head_to_head_trials"] = []
    (path / "results.json").write_text(json.dumps(doc))
    (path / "report.md").write_text("# report\n")
    return path


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> tuple[Path, Path]:
    """One ship of the MLP, every route (cold, compile cache, precompiled forward, AOTInductor)
    measured."""
    run = _run_dir(tmp_path_factory.mktemp("ship") / "run")
    assert main(["ship", str(run)]) == 0
    return run, run / "ship"


def _manifest(ship_dir: Path) -> dict:
    return json.loads((ship_dir / "manifest.json").read_text())


def _model(seed: int = 0):
    from torchkiln.runner.protocol.settings import seed_everything
    from torchkiln.workloads import load_workload

    seed_everything(seed)
    return load_workload(MLP, preset="tiny", step="infer").model


def test_ship_writes_the_module_the_manifest_and_the_artifacts(shipped):
    run, ship_dir = shipped
    m = _manifest(ship_dir)
    assert m["spec"] == "inductor" and m["workload"] == MLP
    for field in ("kiln", "torch", "python", "cpu_capability"):
        assert field in m["environment"]
    assert set(m["model_hash"]) == {"layout", "params", "code", "packages"}
    assert m["shapes"] == [[[4, 16]]]
    assert {"cache", "kernels", "precompiled", "aoti"} <= set(m["artifacts"])
    assert m["artifacts"]["precompiled"]["functions"] == 1 and m["precompile"] is None
    for entry in m["artifacts"].values():
        assert len(entry["sha256"]) == 64 and (ship_dir / entry["file"]).stat().st_size
    text = (ship_dir / "pick.py").read_text()
    assert "SPEC = 'inductor'" in text and "torch.compile(model)" in text
    assert "## Shipped" in (run / "report.md").read_text()
    assert json.loads((run / "results.json").read_text())["ship"]["spec"] == "inductor"


def test_each_route_in_a_fresh_process_gives_the_compiled_models_outputs(shipped):
    routes = _manifest(shipped[1])["routes"]
    assert set(routes) == {"cold", "cache", "precompiled", "aoti"}
    for name, r in routes.items():
        assert r["ok"], r
        assert r["route"] == name
        assert r["steady_ms"]["median"] > 0 and r["first_call_s"] > 0
    for name in ("cache", "precompiled", "aoti"):
        assert routes[name]["matches_cold"], routes[name]
        assert routes[name]["max_abs_diff"] <= 1e-4
    # The compile cache still traces the model with Dynamo; the precompiled forward does not.
    assert routes["cold"]["dynamo_frames"] >= 1 and routes["cache"]["dynamo_frames"] >= 1
    assert routes["precompiled"]["dynamo_frames"] == 0


def test_the_cache_loaded_first_call_beats_a_cold_compile(shipped, tmp_path):
    """The ratio the ship exists for, over three runs of each (medians), with generous slack:
    each process has its own empty Inductor cache, so cold is cold."""
    from torchkiln.ship.api import measure_routes

    def until_first_output(r: dict) -> float:  # the artifact's loading counts
        return r["load_s"] + r["first_call_s"]

    routes = _manifest(shipped[1])["routes"]
    cold = [until_first_output(routes["cold"])]
    cache = [until_first_output(routes["cache"])]
    for i in range(2):
        got = measure_routes(shipped[1], tmp_path / str(i), ["cache"])
        cold.append(until_first_output(got["cold"]))
        cache.append(until_first_output(got["cache"]))
    assert statistics.median(cache) < 0.9 * statistics.median(cold), (cache, cold)


def _copy(ship_dir: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "ship"
    shutil.copytree(ship_dir, dest)
    return dest


@pytest.mark.parametrize("tamper", ["torch", "code", "layout", "old-manifest-weights"])
def test_a_manifest_that_does_not_fit_falls_back_to_a_cold_compile(shipped, tmp_path, tamper):
    import torchkiln
    from torchkiln.ship import ShipFallbackWarning

    ship_dir = _copy(shipped[1], tmp_path)
    m = _manifest(ship_dir)
    seed, match = 0, tamper
    if tamper == "torch":
        m["environment"]["torch"] = "0.0.1"
    elif tamper in ("code", "layout"):
        m["model_hash"][tamper] = "0" * 64  # other module source, other parameter shapes
    else:  # a manifest from before `layout`: its weights are checked for every route
        del m["model_hash"]["layout"]
        seed, match = 1, "params"
    model = _model(seed=seed)
    (ship_dir / "manifest.json").write_text(json.dumps(m))
    with pytest.warns(ShipFallbackWarning, match=match):
        out = torchkiln.load(ship_dir, model)
    assert out.kiln_route == "cold"
    assert "do not fit" in out.kiln_reason


@pytest.mark.parametrize("reader", ["precompiled", "cache"])
def test_other_weights_pass_by_the_package_that_holds_them_to_a_route_that_reads_them(
    shipped, tmp_path, reader
):
    """An AOTInductor package holds the weights it was built with; the precompiled forward and
    the compile cache read the model's at each call, so a model with other weights (another
    checkpoint of the same code) takes them, and gives its own outputs."""
    import torch

    import torchkiln

    ship_dir = _copy(shipped[1], tmp_path)
    m = _manifest(ship_dir)
    m["route_order"] = ["aoti", reader]
    (ship_dir / "manifest.json").write_text(json.dumps(m))
    model = _model(seed=1)
    x = torch.randn(4, 16)
    with torch.no_grad():
        expected = model(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning: an artifact route serves
        out = torchkiln.load(ship_dir, model)
    assert out.kiln_route == reader
    assert "aoti artifact holds the weights it was built with" in out.kiln_reason
    torch.testing.assert_close(out(x), expected, rtol=1e-4, atol=1e-5)
    with torch.no_grad():  # read at each call: a change in place shows in the next output
        model.fc1.weight.mul_(2.0)
        expected = model(x)
    torch.testing.assert_close(out(x), expected, rtol=1e-4, atol=1e-5)


def test_a_frozen_pick_fits_only_its_own_weights():
    import torch

    from torchkiln.ship.load import _holds_weights, _weights_differ
    from torchkiln.ship.manifest import model_hash

    model = torch.nn.Linear(2, 2)
    doc = {"spec": "inductor:freezing=true", "model_hash": model_hash(model)}
    assert _holds_weights("cache", doc) and _holds_weights("precompiled", doc)
    assert not _holds_weights("cache", {**doc, "spec": "inductor"})
    assert _holds_weights("aoti", {**doc, "spec": "inductor"})
    assert not _weights_differ(doc, model)
    with torch.no_grad():
        model.weight.add_(1.0)
    assert _weights_differ(doc, model)
    assert model_hash(model)["layout"] == doc["model_hash"]["layout"]


def test_a_truncated_artifact_is_refused_and_never_loaded(shipped, tmp_path, monkeypatch):
    import torch

    import torchkiln
    from torchkiln.ship import ShipIntegrityError

    ship_dir = _copy(shipped[1], tmp_path)
    m = _manifest(ship_dir)
    m["route_order"] = ["cache"]
    (ship_dir / "manifest.json").write_text(json.dumps(m))
    blob = ship_dir / m["artifacts"]["cache"]["file"]
    blob.write_bytes(blob.read_bytes()[:100])
    calls = []
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda b: calls.append(b))
    with pytest.raises(ShipIntegrityError, match="truncated or altered"):
        torchkiln.load(ship_dir, _model())
    assert calls == []
    assert main(["ship", "--check", str(ship_dir)]) == 1


def test_a_fitting_directory_loads_its_fastest_measured_route_and_says_so(shipped):
    import torchkiln

    out = torchkiln.load(shipped[1], _model(), route="cache")
    assert out.kiln_route == "cache" and "fits" in out.kiln_reason
    default = _manifest(shipped[1])["route_order"]
    assert default and set(default) <= {"aoti", "precompiled", "cache"}


def test_the_precompiled_forward_serves_its_shape_and_compiles_a_new_one_cold(shipped):
    import torch

    import torchkiln

    model = _model()
    out = torchkiln.load(shipped[1], model, route="precompiled")
    assert out.kiln_route == "precompiled"
    # Where the load went: the compiler's imports, the check, the caches, the functions.
    assert {"imports_s", "check_s", "kernels_s", "functions_s"} <= set(out.kiln_load_phases)
    assert sum(out.kiln_load_phases.values()) <= out.kiln_load_s + 1e-3
    x = torch.randn(4, 16)
    with torch.no_grad():
        want = model(x)
    assert torch.allclose(out(x), want, atol=1e-5)
    assert out.kiln_fallback_calls == 0
    # Weights are read from the module at each call, not baked in at build.
    with torch.no_grad():
        model.fc1.weight.mul_(0.5)
        want = model(x)
    assert torch.allclose(out(x), want, atol=1e-5)
    # A batch the ship never saw: no function's guards accept it, so it is compiled cold.
    y = torch.randn(6, 16)
    with torch.no_grad():
        want = model(y)
    assert torch.allclose(out(y), want, atol=1e-5)
    assert out.kiln_fallback_calls == 1
    # The guard that turned it away, in Dynamo's words.
    assert "size mismatch" in out.kiln_fallback_reason and "actual 6" in out.kiln_fallback_reason


def test_precompiled_functions_are_read_under_the_picks_compiler_settings(shipped, monkeypatch):
    """torch takes some settings of a loaded function from the reading process (CUDA graphs for
    reduce-overhead): the functions are read with the mode's settings on, and left as they were
    after."""
    import torch
    import torch._inductor.config as inductor_config

    from torchkiln.ship import precompiled
    from torchkiln.variants import parse_variant

    assert parse_variant("inductor:mode=reduce-overhead").backend.precompile_config()[
        "triton.cudagraphs"
    ]
    assert parse_variant("inductor").backend.precompile_config() == {}
    seen = []

    def reading(*a, **k):  # what a reading torch would see of the settings
        seen.append(inductor_config.triton.cudagraphs)
        return lambda *args, **kwargs: None

    monkeypatch.setattr(torch.compiler, "load_compiled_function", reading)
    before = inductor_config.triton.cudagraphs
    art = shipped[1] / _manifest(shipped[1])["artifacts"]["precompiled"]["file"]
    precompiled.load(art, _model(), "inductor:mode=reduce-overhead")
    assert seen and all(seen)
    assert inductor_config.triton.cudagraphs == before


def test_the_precompiled_forward_loads_for_the_same_class_imported_under_another_name(
    shipped, tmp_path
):
    """Production imports the model's class from its own module, not from the workload file kiln
    loaded: the same source under another module name still takes the precompiled route."""
    import torch

    import torchkiln
    from torchkiln.runner.protocol.settings import seed_everything
    from torchkiln.workloads import load_workload

    elsewhere = tmp_path / "models_v1.py"
    shutil.copy(Path(MLP.split(":")[0]), elsewhere)
    seed_everything(0)
    model = load_workload(f"{elsewhere}:mlp", preset="tiny", step="infer").model
    assert type(model).__module__ != _manifest(shipped[1])["model_module"]
    out = torchkiln.load(shipped[1], model, route="precompiled")
    assert out.kiln_route == "precompiled", out.kiln_reason
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert torch.allclose(out(x), model(x), atol=1e-5)
    assert out.kiln_fallback_calls == 0


def test_a_route_that_fails_to_load_warns_and_the_next_one_serves(shipped, monkeypatch):
    import torchkiln
    from torchkiln.ship import ShipFallbackWarning, precompiled

    def broken(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'models_v1'")

    monkeypatch.setattr(precompiled, "load", broken)
    ship_dir = shipped[1]
    with pytest.warns(ShipFallbackWarning, match="precompiled route failed to load"):
        out = torchkiln.load(ship_dir, _model(), route="precompiled")
    assert out.kiln_route == "cold" and "models_v1" in out.kiln_reason


def test_ship_check_exit_codes(shipped, tmp_path, capsys):
    assert main(["ship", "--check", str(shipped[1])]) == 0
    ship_dir = _copy(shipped[1], tmp_path)
    m = _manifest(ship_dir)
    m["environment"]["torch"] = "0.0.1"
    (ship_dir / "manifest.json").write_text(json.dumps(m))
    capsys.readouterr()
    assert main(["ship", "--check", str(ship_dir)]) == 1
    assert "torch: built with '0.0.1'" in capsys.readouterr().out
    assert main(["ship", "--check", str(tmp_path)]) == 2


def test_the_pick_module_applies_the_variant_from_the_registry(shipped, monkeypatch):
    import importlib

    monkeypatch.syspath_prepend(str(shipped[1].parent))
    pick = importlib.import_module("ship.pick")
    out = pick.apply(_model())
    assert out.variant.spec == "inductor" and out.kiln_route == "cold"


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_bad_input_exits_2_with_one_line(tmp_path, capsys):
    assert main(["ship", str(_run_dir(tmp_path / "nopick", best=None))]) == 2
    assert "no pick" in _one_line_error(capsys)
    assert main(["ship", str(_run_dir(tmp_path / "failed", passed=False))]) == 2
    assert "correctness" in _one_line_error(capsys)
    assert main(["ship", str(tmp_path / "missing")]) == 2
    assert "does not exist" in _one_line_error(capsys)
    good = _run_dir(tmp_path / "good")
    if os.geteuid() == 0:  # root writes anywhere a mode allows nothing: /proc refuses even root
        ro = Path("/proc/kiln-ship")
    else:
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
    assert main(["ship", str(good), "--to", str(ro)]) == 2
    assert "cannot write there" in _one_line_error(capsys)


def test_export_failures_are_diagnosed_with_their_remedy():
    from torchkiln.ship.export import diagnose, dynamic_shapes, varying_dims

    # What torch 2.14.1 raises exporting transformers 5.24's GPT2LMHeadModel as it comes.
    met = RuntimeError(
        "Found <class 'transformers.cache_utils.DynamicCache'> in output, which is not a known "
        "type. If this type holds tensors, you need to register a pytree for it."
    )
    d = diagnose(met)
    assert "use_cache = False" in d["remedy"] and "DynamicCache" in d["error"]
    d = diagnose(RuntimeError("Constraints violated (in0_d1)! specialized to 128"))
    assert "Dim" in d["remedy"]
    ranges = varying_dims([[[8, 128]], [[8, 256]], [[8, 64]]])
    assert ranges == {0: {1: (64, 256)}}
    import torch

    spec = dynamic_shapes((torch.zeros(8, 128),), ranges)
    assert list(spec[0]) == [1] and spec[0][1].min == 64 and spec[0][1].max == 256
    assert varying_dims([[[1, 2]]]) == {}


def test_precompile_failures_are_diagnosed_with_their_remedy():
    import torch

    from torchkiln.ship import precompiled
    from torchkiln.variants import parse_variant
    from torchkiln.variants.base import PrecompileUnsupported

    # What torch 2.14.1 raises saving a function whose model class is local to a function.
    local = TypeError(
        "Type <class 'f.<locals>.Net'> for object Net() cannot be saved into torch.compile() "
        "package since it's defined in local scope. Please define the class at global scope."
    )
    assert precompiled.diagnose(local)["remedy"] == "define the class at module level"
    other = precompiled.diagnose(RuntimeError("boom"))
    assert other["reason"] == "torch.compile's ahead-of-time compile failed"
    assert "compile-cache route" in other["remedy"] and other["error"] == "RuntimeError: boom"
    # Export's own diagnoses (a Dim range) are not given for this compile's failures.
    dim = precompiled.diagnose(RuntimeError("unknown option; guard ... Dim(batch)"))
    assert dim["reason"] == "torch.compile's ahead-of-time compile failed"
    saved = precompiled.diagnose(RuntimeError("ID_MATCH guard cannot be serialized."))
    assert "identity" in saved["reason"]
    # What torch 2.11.0 raised precompiling GPT-2 as it comes (transformers 5.25).
    view = precompiled.diagnose(
        AssertionError(
            "Guarded object must be identical, None or ephemeral (dead weakref), got <weakref at "
            "0x7f0f; to '_PerLayerConfigView' at 0x7f0f> vs <weakref at 0x7f0f; to "
            "'_PerLayerConfigView' at 0x7f10>"
        )
    )
    assert "made anew on every access" in view["reason"] and "per-layer view" in view["reason"]
    assert view["remedy"].startswith("model.config.use_cache = False")
    other_view = precompiled.diagnose(AssertionError("Guarded object must be identical, got x"))
    assert other_view["remedy"] == "the compile-cache route serves the pick"
    brk = precompiled.diagnose(RuntimeError("Data-dependent branching; graph break in forward"))
    assert "`kiln explain`" in brk["remedy"]
    model, x = torch.nn.Linear(4, 4), torch.randn(2, 4)
    for spec, why in (("inductor:scope=regions", "whole-model"), ("eager", "no ahead-of-time")):
        with pytest.raises(PrecompileUnsupported, match=why):
            parse_variant(spec).backend.precompile(model, (x,), {})


def test_the_shipped_section_renders_each_route(shipped):
    from torchkiln.ship.report import markdown_section, summary

    m = _manifest(shipped[1])
    lines = markdown_section(summary(m, shipped[1]))
    assert lines[1] == "## Shipped"
    assert sum(line.startswith("| ") and "= cold" in line for line in lines) == 4
    # Each artifact route's paired ratio to cold, with its interval; cold itself has none.
    paired = [line for line in lines if line.startswith("| ") and "% [" in line]
    assert len(paired) == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert markdown_section(None) == []


def _route(first_fast_s, first_call_s, steady_ms, load_s=0.5):
    return {
        "ok": True,
        "load_s": load_s,
        "first_call_s": first_call_s,
        "first_fast_s": first_fast_s,
        "steady_ms": {"median": steady_ms},
        "compile_phases_s": {
            "entire_frame_compile": first_call_s * 0.9,
            "backend_compile": first_call_s * 0.7,
            "inductor_compile": first_call_s * 0.5,
        },
    }


def test_bench_ship_judges_the_goals_and_names_the_phase_that_missed():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_ship.py"
    spec = importlib.util.spec_from_file_location("bench_ship", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    routes = {"cold": _route(20.0, 19.0, 3.0), "cache": _route(4.0, 3.0, 3.03)}
    ok = bench.judge("infer", routes, ["cache"])
    assert ok["route"] == "cache" and ok["first_output_met"] and ok["steady_met"]
    routes["cache"] = _route(9.0, 2.0, 3.2, load_s=1.0)  # 6 s after the first call: recording
    missed = bench.judge("infer", routes, ["cache"])
    assert not missed["first_output_met"] and not missed["steady_met"]
    assert missed["most_time"] == "CUDA-graph recording (calls until steady)"
    # A slow load is split into its phases, as the route measured them.
    routes["cache"] = _route(9.0, 0.5, 3.0, load_s=8.0)
    routes["cache"]["load_phases_s"] = {"imports_s": 1.5, "kernels_s": 6.0}
    where = bench.judge("infer", routes, ["cache"])
    assert where["most_time"] == "kernel archive extraction (load)"
    assert where["phases_s"]["the rest of load"] == 0.5
    train = bench.judge("train", {"cold": _route(20, 20, 5), "cache": _route(9, 9, 5)}, ["cache"])
    assert train["first_step_share_of_cold"] == 0.463 and not train["first_output_met"]
    # Rounds of processes: the median of each round's ratio to its own cold process, and the
    # cold processes' spread, judge the steady step (the first round alone read +10%).
    cold, cache = _route(20.0, 19.0, 3.0), _route(4.0, 3.0, 3.3)
    cold["rounds"] = [{"steady_ms": ms} for ms in (3.0, 3.3, 3.1)]
    cache["rounds"] = [
        {"first_fast_s": f, "steady_ms": ms, "steady_vs_cold": ms / c - 1}
        for f, ms, c in ((4.0, 3.3, 3.0), (4.4, 3.3, 3.3), (4.2, 3.13, 3.1))
    ]
    rounds = bench.judge("infer", {"cold": cold, "cache": cache}, ["cache"])
    assert rounds["steady_vs_cold"] == 0.0097 and rounds["steady_met"]
    assert rounds["steady_vs_cold_rounds"] == [0.1, 0.0, 0.0097]
    assert rounds["cold_spread"] == 0.1 and rounds["first_fast_s"] == 4.2
    # Paired reps against a live cold process judge the steady step where they were measured.
    cache["paired"] = {"route_over_cold": 1.031, "ci95": [1.02, 1.04]}
    paired = bench.judge("infer", {"cold": cold, "cache": cache}, ["cache"])
    assert paired["steady_vs_cold"] == 0.031 and not paired["steady_met"]
    assert paired["steady_judged_on"] == "paired reps"
    assert paired["steady_vs_cold_ci95"] == [0.02, 0.04]
    assert paired["steady_vs_cold_rounds"] == [0.1, 0.0, 0.0097]  # reported beside it


def test_rounds_of_route_processes_alternate_with_the_cold_compile(tmp_path, monkeypatch):
    from torchkiln.ship import api

    started: list[str] = []
    steady = {"cold": [2.0, 2.2], "cache": [2.1, 2.2]}

    def spawn(module, job, work, timeout_s):
        started.append(job["route"])
        ms = steady[job["route"]][len([r for r in started if r == job["route"]]) - 1]
        return {"ok": True, "first_fast_s": 1.0, "steady_ms": {"median": ms}}

    monkeypatch.setattr(api, "_spawn", spawn)
    monkeypatch.setattr(api, "_compare", lambda a, b, precision: {"matches_cold": True})
    got = api.measure_routes(tmp_path, tmp_path / "w", ["cache"], rounds=2, paired=False)
    assert started == ["cold", "cache", "cold", "cache"]
    assert [r["steady_ms"] for r in got["cold"]["rounds"]] == [2.0, 2.2]
    assert [r["steady_vs_cold"] for r in got["cold"]["rounds"]] == [None, None]
    ratios = [round(r["steady_vs_cold"], 4) for r in got["cache"]["rounds"]]
    assert ratios == [0.05, 0.0] and got["cache"]["matches_cold"]
    started.clear()
    one = api.measure_routes(tmp_path, tmp_path / "one", ["cache"], paired=False)
    assert "rounds" not in one["cache"]


def test_tune_takes_ship_and_the_cli_lists_the_ship_command():
    from torchkiln.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["tune", "simple", "--ship"]).ship is True
    args = parser.parse_args(["ship", "runs/x", "--package", "cache", "--to", "d"])
    assert (args.package, args.to, args.check) == ("cache", "d", False)


def test_the_load_order_puts_slower_or_differing_routes_last_and_failed_ones_out():
    from torchkiln.ship.api import _order

    def r(name, first_fast, samples, same=True, ok=True):
        steady = {"median": statistics.median(samples), "samples": samples}
        return {
            "ok": ok,
            "route": name,
            "first_fast_s": first_fast,
            "steady_ms": steady,
            "matches_cold": same,
        }

    cold = r("cold", 30.0, [1.0, 1.0, 1.0])
    fast = {"cold": cold, "aoti": r("aoti", 1.0, [1.0, 1.01]), "cache": r("cache", 5.0, [1.0])}
    assert _order(fast) == ["aoti", "cache"]
    slow = {**fast, "aoti": r("aoti", 1.0, [1.3, 1.4])}  # even its fastest rep is slower
    assert _order(slow) == ["cache", "aoti"]
    assert _order({**fast, "aoti": r("aoti", 1.0, [1.0], same=False)}) == ["cache"]
    assert _order({**fast, "cache": r("cache", 5.0, [1.0], ok=False)}) == ["aoti"]


class _Guarded:
    """A compiled function's face: guards that accept a call only outside autocast."""

    def __init__(self, accepts_autocast: bool = False, never: bool = False) -> None:
        self.accepts_autocast, self.never = accepts_autocast, never
        self.calls: list[bool] = []

    def guard_check(self, model, *args, **kwargs) -> bool:
        import torch

        on = torch.is_autocast_enabled("cpu")
        return not self.never and (self.accepts_autocast or not on)

    def __call__(self, model, *args, **kwargs):
        import torch

        self.calls.append(torch.is_autocast_enabled("cpu"))
        return args[0]


def test_precompiled_functions_are_called_in_the_context_their_guards_accept():
    """A torch whose compiled function's guards turn autocast calls away (its inputs' dispatch
    keys recorded without the autocast key) is called with autocast off; one that accepts them
    as they come is called as they come; one that accepts neither is not shipped."""
    import torch

    from torchkiln.ship.precompiled import Precompiled, _accepting_context

    x = torch.ones(2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _accepting_context(_Guarded(), None, (x,), {}, "cpu") is True
        assert _accepting_context(_Guarded(accepts_autocast=True), None, (x,), {}, "cpu") is False
        why = _accepting_context(_Guarded(never=True), None, (x,), {}, "cpu")
        assert isinstance(why, str) and why
    f = _Guarded()
    run = Precompiled(None, [f], lambda: pytest.fail("compiled cold"), True, "cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        run(x)
    assert f.calls == [False] and run.fallback_calls == 0


DECORATED = str(Path(__file__).parent / "fixtures" / "ship_decorated.py") + ":build"


@pytest.mark.slow
def test_a_decorated_forward_that_returns_a_dict_is_precompiled_and_loads_without_tracing(
    tmp_path,
):
    """A forward wrapped by a decorator that reads the wrapped function's code (a guard on its
    identity, which a saved function cannot keep) and returning an OrderedDict, as
    transformers' models do: the module's call is compiled, the identity guard left to the
    manifest's hashes and package versions, and the loading process traces nothing."""
    import importlib.metadata

    import torch

    import torchkiln
    from torchkiln.runner.protocol.settings import seed_everything
    from torchkiln.ship import ship_workload
    from torchkiln.workloads import load_workload

    m = ship_workload(
        DECORATED, "inductor", preset="tiny", to=tmp_path / "s", package="precompiled"
    )
    assert "precompiled" in m["artifacts"], m["precompile"]
    probe = m["routes"]["precompiled"]
    assert probe["ok"] and probe["route"] == "precompiled", probe
    assert probe["dynamo_frames"] == 0 and probe["fallback_calls"] == 0 and probe["matches_cold"]
    assert m["model_hash"]["packages"]["torch"] == importlib.metadata.version("torch")
    seed_everything(0)
    model = load_workload(DECORATED, preset="tiny", step="infer").model
    out = torchkiln.load(tmp_path / "s", model, route="precompiled")
    x = torch.randn(4, 16)
    got = out(x)
    with torch.no_grad():
        assert torch.allclose(got["out"], model(x)["out"], atol=1e-5)
    assert out.kiln_fallback_calls == 0


def test_a_precompiled_function_is_loaded_with_the_builtins_its_code_names():
    """A loader that wants every name the compiled code reads in ``f_globals`` finds the builtins
    there (the code Dynamo writes for a model output can call ``type``), and the modules Dynamo
    had installed, under their recorded names."""
    import collections

    from torchkiln.variants import aot_entry

    g = aot_entry.load_globals({"___module_collections_0": "collections"})
    assert g["type"] is type and g["isinstance"] is isinstance
    assert g["___module_collections_0"] is collections
    assert g["call_module"] is aot_entry.call_module
    assert g["__name__"] == aot_entry.__name__  # the module's own names win over the builtins'


def test_the_function_compiled_ahead_of_time_starts_from_a_namespace_with_the_builtins():
    """torch checks, where it compiles, that every global the rewritten code reads is in the
    compiled function's own namespace: the builtins are there by name, as in the loader's."""
    import builtins

    from torchkiln.variants import aot_entry

    space = aot_entry.call_module.__globals__
    for name in ("type", "isinstance", "getattr", "len", "tuple", "dict"):
        assert space[name] is getattr(builtins, name)
    assert space["__name__"] == aot_entry.__name__


def test_other_versions_of_the_models_packages_do_not_fit():
    import torch

    from torchkiln.ship.load import _fit
    from torchkiln.ship.manifest import environment, model_hash

    model = torch.nn.Linear(2, 2)
    doc = {"device": "cpu", "environment": environment("cpu"), "model_hash": model_hash(model)}
    assert _fit(doc, model) == []
    doc["model_hash"] = {**doc["model_hash"], "packages": {"torch": "0.0"}}
    (problem,) = _fit(doc, model)
    assert problem.startswith("model packages: built with {'torch': '0.0'}")


def test_each_route_is_timed_against_the_cold_process_rep_by_rep(shipped):
    """The cold process waits, measured, while each route's process is timed against it in
    turns; the ratio is the median of each pair's."""
    routes = _manifest(shipped[1])["routes"]
    assert "paired" not in routes["cold"]
    for name in ("cache", "precompiled", "aoti"):
        pair = routes[name]["paired"]
        assert "error" not in pair, pair
        assert pair["reps"] == len(pair["cold_ms"]) == len(pair["route_ms"]) == 20
        ratios = sorted(r / c for r, c in zip(pair["route_ms"], pair["cold_ms"], strict=True))
        assert pair["route_over_cold"] == pytest.approx(statistics.median(ratios))
        assert pair["ci95"][0] <= pair["route_over_cold"] <= pair["ci95"][1]


def test_paired_reps_alternate_which_process_goes_first():
    from torchkiln.ship.pairing import paired_reps

    calls = []

    def timed(stream):
        calls.append(stream)
        return 2.0 if stream == "route" else 1.0

    got = paired_reps("cold", "route", reps=4, timed=timed)
    assert calls == ["cold", "route", "route", "cold"] * 2
    assert got["route_over_cold"] == 2.0 and got["reps"] == 4

    def broken(stream):
        if stream == "route":
            raise ConnectionError("the process closed its end before answering")
        return 1.0

    got = paired_reps("cold", "route", reps=4, timed=broken)
    assert got["error"].startswith("ConnectionError") and got["cold_ms"] == [1.0]


def test_a_process_that_dies_before_it_is_ready_is_not_waited_for():
    import subprocess
    import sys
    import time

    from torchkiln.ship.pairing import Listener

    listener = Listener()
    try:
        proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
        t = time.monotonic()
        assert listener.accept(proc, timeout_s=120) is None
        assert proc.returncode == 3 and time.monotonic() - t < 60
    finally:
        listener.close()
    assert not Path(listener.address).exists()


def test_a_stopped_pairing_leaves_no_process_waiting(shipped, tmp_path, monkeypatch):
    from torchkiln.ship import api, pairing

    launched = []
    real_launch = api._launch

    def launch(module, job, work):
        launched.append(real_launch(module, job, work))
        return launched[-1]

    def interrupted(cold, route, *a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "_launch", launch)
    monkeypatch.setattr(pairing, "paired_reps", interrupted)
    with pytest.raises(KeyboardInterrupt):
        api.measure_routes(shipped[1], tmp_path / "w", ["cache"])
    assert len(launched) == 2  # cold, waiting; cache, waiting
    for proc in launched:
        assert proc.wait(timeout=30) is not None  # ended, not left waiting on its socket
