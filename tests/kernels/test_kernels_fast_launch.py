"""The experimental fast launch (kernels/_fast_launch.py) on CPU, with stand-ins for Triton's
JITFunction and CompiledKernel: which calls reuse a kept compiled kernel, with which arguments,
and that a launcher refusing them hands the call back to the JIT. On a GPU the same path runs
the real kernels in test_kernels_gpu (fast launch on, each call made twice)."""

from __future__ import annotations

import warnings

import pytest
import torch

from torchkiln.kernels import _fast_launch as fl


class FakeCompiled:
    def __init__(self, log, refuse=False):
        self.log, self.refuse = log, refuse

    def __getitem__(self, grid):
        def run(*args):
            if self.refuse:
                raise TypeError("function takes exactly 5 arguments (7 given)")
            self.log.append(("compiled", grid, args))

        return run


class FakeJIT:
    """Names its parameters like a JITFunction; each launch is logged and returns the kernel
    Triton would have compiled for it."""

    arg_names = ["x_ptr", "y_ptr", "n", "scale", "BLOCK", "SAFE"]

    def __init__(self, refuse=False):
        self.log, self.refuse = [], refuse

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.log.append(("jit", grid, args, kwargs))
            return FakeCompiled(self.log, self.refuse)

        return run


@pytest.fixture
def enabled(monkeypatch):
    monkeypatch.setattr(fl, "_current_device", lambda: 0)  # no CUDA here to ask
    monkeypatch.setitem(fl._state, "enabled", True)
    monkeypatch.setitem(fl._state, "broken", None)


def test_the_key_holds_what_triton_specialises_on():
    base = torch.zeros(64)
    assert fl.arg_key(base) != fl.arg_key(base.to(torch.bfloat16))  # dtype
    assert fl.arg_key(base) != fl.arg_key(base[1:])  # 16-byte alignment (4 bytes off)
    assert fl.arg_key(base) == fl.arg_key(base[4:])  # 16 bytes off: still aligned
    assert len({fl.arg_key(n) for n in (1, 16, 17, 2**31, 32)}) == 4  # 16 and 32 alike
    assert fl.arg_key(True) != fl.arg_key(1) and fl.arg_key(1.0) == fl.arg_key(2.5)
    with pytest.raises(fl._Uncacheable):
        fl.arg_key("a string")


def test_a_repeated_call_launches_the_kept_compiled_kernel(enabled):
    jit = FakeJIT()
    kernel = fl.FastKernel(jit)
    x, y = torch.zeros(64), torch.zeros(64)
    kernel[(8,)](x, y, 64, 0.5, BLOCK=64, SAFE=False, num_warps=4)
    assert [e[0] for e in jit.log] == ["jit"]
    kernel[(8,)](x, y, 64, 0.25, BLOCK=64, SAFE=False, num_warps=4)  # a float: same kernel
    # Every argument in signature order, the constexprs included; the grid made 3-D.
    assert jit.log[1] == ("compiled", (8, 1, 1), (x, y, 64, 0.25, 64, False))
    # What Triton compiles apart is launched through the JIT again, then kept too.
    kernel[(8,)](x, y, 65, 0.5, BLOCK=64, SAFE=False, num_warps=4)  # n no longer % 16
    kernel[(8,)](x, y, 64, 0.5, BLOCK=64, SAFE=True, num_warps=4)  # another constexpr
    kernel[(8,)](x, y, 64, 0.5, BLOCK=64, SAFE=False, num_warps=8)  # another launch option
    kernel[(8,)](x[1:], y, 64, 0.5, BLOCK=64, SAFE=False, num_warps=4)  # misaligned pointer
    assert [e[0] for e in jit.log[2:]] == ["jit"] * 4
    kernel[(8,)](x, y, 65, 0.5, BLOCK=64, SAFE=False, num_warps=4)
    assert jit.log[-1][0] == "compiled" and len(kernel.cache) == 5


def test_a_refused_launch_turns_the_fast_path_off_and_runs_through_the_jit(enabled):
    jit = FakeJIT(refuse=True)
    kernel = fl.FastKernel(jit)
    x = torch.zeros(64)
    kernel[(1,)](x, x, 64, 1.0, BLOCK=64, SAFE=False)
    with pytest.warns(RuntimeWarning, match="fast launch turned off"):
        kernel[(1,)](x, x, 64, 1.0, BLOCK=64, SAFE=False)
    assert [e[0] for e in jit.log] == ["jit", "jit"]  # the refused call ran all the same
    assert "refused" in fl.fast_launch_broken() and not fl.fast_launch_enabled()


def test_calls_it_cannot_key_go_through_the_jit(enabled):
    jit = FakeJIT()
    kernel = fl.FastKernel(jit)
    x = torch.zeros(64)
    for _ in range(2):
        kernel[(1,)](x, x, "n", 1.0, BLOCK=64, SAFE=False)  # an argument of unknown kind
        kernel[(1,)](x, x, 64, 1.0, BLOCK=64)  # SAFE missing: the JIT's defaults apply
    assert [e[0] for e in jit.log] == ["jit"] * 4 and not kernel.cache


def test_launchable_hands_out_the_fast_kernel_only_when_on_and_direct(monkeypatch):
    pytest.importorskip("triton")
    from triton.runtime.jit import JITFunction

    from torchkiln.kernels._launch import direct_launches, launchable

    def body(x_ptr):
        pass

    kernel = JITFunction(body)
    monkeypatch.setitem(fl._state, "broken", None)
    with direct_launches():
        with fl.fast_launch(False):
            assert launchable(kernel) is kernel
        with fl.fast_launch(True):
            wrapped = launchable(kernel)
            assert isinstance(wrapped, fl.FastKernel) and wrapped.kernel is kernel
            assert launchable(kernel) is wrapped  # one per kernel
    with fl.fast_launch(True):
        assert not isinstance(launchable(kernel), fl.FastKernel)  # traced: wrap_triton
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fl.fast_launch_broken() is None


def test_the_bench_arm_runs_its_call_with_the_fast_launch_on(monkeypatch):
    from torchkiln.kernels import _cases

    monkeypatch.setitem(fl._state, "enabled", False)
    monkeypatch.setitem(fl._state, "broken", None)
    assert _cases._fast_launched(fl.fast_launch_enabled)() is True
    assert fl.fast_launch_enabled() is False  # restored after the call
