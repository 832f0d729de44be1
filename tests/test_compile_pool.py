"""On request, Inductor's compile workers start below the trial's priority, which stays."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or importlib.util.find_spec("triton") is None,
    reason="reads priorities from Linux's /proc; Inductor's worker pool comes with Triton",
)

PROBE = """
import glob, json, os, time
from torchkiln.runner.protocol.compile_pool import start_lowered
own = os.getpriority(os.PRIO_PROCESS, 0)
record = start_lowered(7)
from torch._inductor.async_compile import AsyncCompile
sidecar = AsyncCompile.process_pool().process.pid
workers = []
deadline = time.monotonic() + 60
while not workers and time.monotonic() < deadline:
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = open(stat).read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == sidecar:  # ppid; fields[16] is the nice value
            workers.append(int(fields[16]))
    time.sleep(0.2)
print(json.dumps({"own": own, "after": os.getpriority(os.PRIO_PROCESS, 0), "steps": 7,
                  "record": record, "workers": workers}))
"""


def test_the_pool_and_its_workers_run_below_the_trial_which_keeps_its_priority():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=240, check=True
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    lowered = min(got["own"] + got["steps"], 19)
    assert got["record"] == {"started": True, "nice": lowered}
    assert got["after"] == got["own"]  # the trial's own thread is untouched
    assert got["workers"] and all(n == lowered for n in got["workers"])


def test_asked_for_an_inductor_trial_starts_its_pool_lowered_before_building_an_eager_none(
    monkeypatch,
):
    import torchkiln.runner.protocol.measure_trial as mt
    from torchkiln.runner.protocol.trial import TrialSpec, base_result
    from torchkiln.runner.protocol.worker import Phases

    calls = []
    real_build = mt.build_arm

    def recording_build(spec, variant, **kw):
        calls.append(("build", variant.spec))
        return real_build(spec, variant, **kw)

    def recording_start(steps):
        assert steps == 10
        calls.append(("pool", None))
        return {"started": True, "nice": 10}

    monkeypatch.setattr(mt, "build_arm", recording_build)
    monkeypatch.setattr(mt.compile_pool, "start_lowered", recording_start)
    monkeypatch.setenv("KILN_COMPILE_NICE", "10")
    fast = {"reps": 3, "min_reps": 3, "warmup_s": 0.0, "warmup_steps": 2, "rep_ms": 2.0}
    for variant, expect in (("inductor", True), ("eager+bf16", False)):
        calls.clear()
        spec = TrialSpec(
            workload="simple",
            variant=variant,
            device="cpu",
            preset="tiny",
            check_accuracy=False,
            count_kernels=False,
            **fast,
        )
        result = base_result(spec)
        mt.measure_trial(spec, result, Phases(None))
        assert result["status"] == "ok", result.get("reason")
        if expect:
            assert calls[0] == ("pool", None)  # before any arm is built
            assert result["compile_pool"] == {"started": True, "nice": 10}
        else:
            assert ("pool", None) not in calls and "compile_pool" not in result


def test_the_priority_is_left_alone_unless_asked_and_a_bad_request_is_refused(monkeypatch):
    from torchkiln.errors import KilnUserError
    from torchkiln.runner.protocol.compile_pool import nice_steps

    monkeypatch.delenv("KILN_COMPILE_NICE", raising=False)
    assert nice_steps() == 0
    monkeypatch.setenv("KILN_COMPILE_NICE", "5")
    assert nice_steps() == 5
    for bad in ("-1", "20", "low"):
        monkeypatch.setenv("KILN_COMPILE_NICE", bad)
        with pytest.raises(KilnUserError, match="KILN_COMPILE_NICE"):
            nice_steps()
