"""The eager launch cache (_launch_cache) on the CPU, with a stand-in for a Triton kernel: what it
records, replays, refuses and turns off. The real kernels' replays run on the GPU (marked `gpu`,
test_kernels_gpu.py)."""

from __future__ import annotations

import types

import pytest
import torch
from kernels_reference import (
    GELU_ATOL,
    assert_close,
    bias_act_backward_ref,
    softmax_backward_ref,
    softmax_ref,
    sum_atol,
)

from torchkiln.kernels import _launch_cache, bias_act_scale, masked_softmax, ops, softmax
from torchkiln.kernels._launch import direct_launches, launchable

_NONE = object()


class _Param:
    def __init__(self, name: str, constexpr: bool = False, default: object = _NONE):
        self.name, self.is_constexpr = name, constexpr
        self.has_default, self.default = default is not _NONE, default


class FakeKernel:
    """(x + b) * scale * ACT into y, as a Triton kernel's JIT launch (`kernel[grid](...)`) and
    its compiled launcher (`warmup(...)[grid3](every parameter in order)`) would; `skew` makes
    the compiled launcher compute something else, `take` changes how many arguments it takes."""

    def __init__(self, name: str, skew: float = 0.0, take: int | None = None):
        self.fn = types.SimpleNamespace(__module__="tests", __qualname__=name)
        self.params = [_Param(n) for n in ("x_ptr", "b_ptr", "y_ptr", "M", "N", "scale")]
        self.params += [_Param("ACT", True, 1), _Param("BLOCK", True, 4)]
        self.skew, self.take = skew, take
        self.jit_launches, self.replays, self.warmups = 0, 0, 0

    def _bind(self, args: tuple, kwargs: dict) -> list:
        names = [p.name for p in self.params]
        out = list(args)
        for p in self.params[len(args) :]:
            out.append(kwargs.get(p.name, p.default))
        assert len(out) == len(names)
        return out

    @staticmethod
    def _compute(x, b, y, m, n, scale, act, block, skew=0.0):
        assert x.shape == (m, n) and isinstance(block, int)
        y.copy_((x + b) * scale * act + skew)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.jit_launches += 1
            self._compute(*self._bind(args, kwargs))

        return launch

    def warmup(self, *args, grid, **kwargs):
        self.warmups += 1
        assert kwargs["num_warps"] == 4
        kernel = self

        class Compiled:
            def __getitem__(self, grid3):
                assert len(grid3) == 3

                def runner(*every):
                    if kernel.take is not None and len(every) != kernel.take:
                        raise TypeError(f"function takes exactly {kernel.take} arguments")
                    kernel.replays += 1
                    kernel._compute(*every, skew=kernel.skew)

                return runner

        return Compiled()


def _body(kernel, x, b, scale, act=2, launches=1):
    def body():
        y = torch.empty_like(x)
        for _ in range(launches):
            launchable(kernel)[(1,)](x, b, y, x.shape[0], x.shape[1], scale, ACT=act, num_warps=4)
        return y

    return body


def _call(cache, kernel, x, b, scale, act=2, launches=1):
    """What an op body's eager_forward does: the replay on a hit, the recorded body on a miss."""
    key = (x.shape, act)
    with direct_launches():
        replay = cache.entries.get(key)
        if replay is None:
            return cache.record(key, _body(kernel, x, b, scale, act, launches))
        y = torch.empty_like(x)
        replay((x, b, y, scale))
        return y


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(_launch_cache, "_checked", {})
    monkeypatch.setattr(_launch_cache, "enabled", True)


def test_a_repeated_call_replays_the_compiled_launch_with_its_new_arguments():
    kernel, cache = FakeKernel("k1"), _launch_cache.LaunchCache(slots=(0, 1, 2, 5), outs=2)
    x, b = torch.randn(3, 4), torch.randn(4)
    y = _call(cache, kernel, x, b, 0.5)
    assert torch.equal(y, (x + b) * 0.5 * 2)
    # The miss launched through the JIT, then checked the first replay into a fresh output.
    assert (kernel.jit_launches, kernel.replays, kernel.warmups) == (1, 1, 1)
    assert _launch_cache.status() == {"tests.k1": "ok"}
    from torchkiln.kernels import launch_cache_status

    assert launch_cache_status() == {"tests.k1": "ok"}
    x2, b2 = torch.randn(3, 4), torch.randn(4)
    y2 = _call(cache, kernel, x2, b2, -3.0)
    assert torch.equal(y2, (x2 + b2) * -3.0 * 2)  # new tensors and scale, the key's ACT
    assert (kernel.jit_launches, kernel.replays) == (1, 2)
    # The template keeps no tensor between calls.
    (replay,) = cache.entries.values()
    assert [type(a) for a in replay.args[:3]] == [type(None)] * 3
    # Another key records again; the kernel is checked once a process.
    y3 = _call(cache, kernel, torch.ones(5, 4), b, 1.0, act=3)
    assert torch.equal(y3, (1 + b).expand(5, 4) * 3)
    assert (kernel.jit_launches, kernel.replays, kernel.warmups) == (2, 2, 2)


def test_a_replay_that_differs_from_the_jit_launch_turns_the_kernel_off():
    kernel, cache = FakeKernel("k2", skew=1e-3), _launch_cache.LaunchCache((0, 1, 2, 5), 2)
    x, b = torch.randn(3, 4), torch.randn(4)
    with pytest.warns(RuntimeWarning, match="launch cache off for tests.k2"):
        y = _call(cache, kernel, x, b, 0.5)
    assert torch.equal(y, (x + b) * 0.5 * 2)  # the JIT launch's result is what is returned
    assert "differs from the JIT launch" in _launch_cache.status()["tests.k2"]
    for _ in range(2):
        assert torch.equal(_call(cache, kernel, x, b, 0.5), y)
    assert (kernel.jit_launches, kernel.replays) == (3, 1)
    # Another cache of the same kernel does not try again.
    other = _launch_cache.LaunchCache((0, 1, 2, 5), 2)
    _call(other, kernel, x, b, 0.5)
    assert (kernel.jit_launches, kernel.replays, kernel.warmups) == (4, 1, 1)


def test_a_launcher_calling_convention_that_fails_is_reported_not_raised():
    kernel, cache = FakeKernel("k3", take=6), _launch_cache.LaunchCache((0, 1, 2, 5), 2)
    x, b = torch.randn(3, 4), torch.randn(4)
    with pytest.warns(RuntimeWarning, match="takes exactly 6"):
        y = _call(cache, kernel, x, b, 0.5)
    assert torch.equal(y, (x + b) * 0.5 * 2)
    assert _launch_cache.status()["tests.k3"].startswith("TypeError")


def test_what_cannot_be_replayed_keeps_the_jit_launch():
    x, b = torch.randn(3, 4), torch.randn(4)
    # Two launches in one body.
    kernel, cache = FakeKernel("k4"), _launch_cache.LaunchCache((0, 1, 2, 5), 2)
    _call(cache, kernel, x, b, 0.5, launches=2)
    assert list(cache.entries.values()) == [None] and kernel.warmups == 0
    _call(cache, kernel, x, b, 0.5, launches=2)
    assert kernel.jit_launches == 4
    # A tensor argument that is not per-call (bias left out of the slots) would be held.
    kernel, cache = FakeKernel("k5"), _launch_cache.LaunchCache((0, 2, 5), 1)
    with pytest.warns(RuntimeWarning, match="b_ptr is not per-call"):
        _call(cache, kernel, x, b, 0.5)
    assert list(cache.entries.values()) == [None]


def test_off_or_outside_direct_launches_the_op_bodies_take_their_launchers(monkeypatch):
    pytest.importorskip("triton")
    from torchkiln.kernels import _softmax

    calls = []
    monkeypatch.setattr(_softmax, "softmax_forward", lambda *a: calls.append(a) or "launched")
    x = torch.randn(3, 4)
    assert _launch_cache.active() is False  # not inside direct_launches (a traced op)
    assert _softmax.eager_forward(x) == "launched"
    with direct_launches():
        assert _launch_cache.active() is True
        monkeypatch.setattr(_launch_cache, "enabled", False)  # KILN_LAUNCH_CACHE=0
        assert _launch_cache.active() is False
        assert _softmax.eager_forward(x, None, 0.5, True) == "launched"
    assert calls == [(x, None, 1.0, False), (x, None, 0.5, True)]
    assert _softmax._FORWARD_CACHE.entries == {}


class TwoOutputs(FakeKernel):
    """y = x + b and z = (x + b).sum(0) per call: an output shaped unlike the inputs, as the
    bias_act backward's partial sums."""

    def __init__(self, name: str, skew: float = 0.0):
        super().__init__(name, skew)
        self.params.insert(3, _Param("z_ptr"))

    @staticmethod
    def _compute(x, b, y, z, m, n, scale, act, block, skew=0.0):
        y.copy_(x + b)
        z.copy_((x + b).sum(0, keepdim=True) + skew)


def _two(cache, kernel, x, b):
    key = (x.shape,)

    def body():
        y, z = torch.empty_like(x), torch.empty(1, x.shape[1])
        launchable(kernel)[(1,)](x, b, y, z, x.shape[0], x.shape[1], 1.0, num_warps=4)
        return y, z

    with direct_launches():
        replay = cache.entries.get(key)
        if replay is None:
            return cache.record(key, body)
        y, z = torch.empty_like(x), torch.empty(replay.shapes[1])
        replay((x, b, y, z))
        return y, z


def test_several_outputs_are_checked_and_their_shapes_kept():
    kernel, cache = TwoOutputs("k8"), _launch_cache.LaunchCache((0, 1, 2, 3), outs=(2, 3))
    for _ in range(3):
        x, b = torch.randn(3, 4), torch.randn(4)
        y, z = _two(cache, kernel, x, b)
        assert torch.equal(y, x + b) and torch.equal(z, (x + b).sum(0, keepdim=True))
    assert (kernel.jit_launches, kernel.replays) == (1, 3)
    (replay,) = cache.entries.values()
    assert replay.shapes == ((3, 4), (1, 4))
    # A second output that differs turns the kernel off, though the first matches.
    kernel, cache = TwoOutputs("k9", skew=1.0), _launch_cache.LaunchCache((0, 1, 2, 3), (2, 3))
    with pytest.warns(RuntimeWarning, match="differs from the JIT launch"):
        _two(cache, kernel, x, b)
    assert list(cache.entries.values()) == [None]


def test_the_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(_launch_cache, "MAX_ENTRIES", 2)
    kernel, cache = FakeKernel("k7"), _launch_cache.LaunchCache((0, 1, 2, 5), 2)
    b = torch.randn(4)
    for rows in (1, 2, 3):
        _call(cache, kernel, torch.randn(rows, 4), b, 1.0)
    assert len(cache.entries) == 1  # cleared at the third key, which was then stored


def _gpu_cases(dtype):
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(64, 3000, generator=gen) * 3).to(dtype).cuda()
    s = (torch.randn(2, 4, 8, 2048, generator=gen) * 3).to(dtype).cuda()
    causal = torch.ones(8, 2048, dtype=torch.bool).tril().cuda()  # [Q, K], shared by heads
    padding = (torch.rand(2, 1, 1, 2048, generator=gen) > 0.3).cuda()
    additive = torch.zeros(8, 2048).masked_fill(~causal.cpu(), float("-inf")).to(dtype).cuda()
    bias = torch.randn(3000, generator=gen).to(dtype).cuda()
    # x one element past an aligned address: its own key (Triton specialises on alignment).
    skewed = torch.empty(x.numel() + 1, dtype=dtype, device="cuda")[1:].view(x.shape)
    skewed.copy_(x)
    return [
        ("softmax", lambda: softmax(x)),
        ("softmax skewed", lambda: softmax(skewed)),
        ("softmax long rows", lambda: softmax(x[:3].repeat(1, 15))),  # 45000: the looped kernel
        ("masked causal", lambda: masked_softmax(s, causal, 0.125)),
        ("masked padding", lambda: masked_softmax(s, padding, 0.125)),
        ("masked additive, negative scale", lambda: masked_softmax(s, additive, -0.5)),
        ("masked none", lambda: masked_softmax(s, None, 2.0)),
        ("bias relu", lambda: bias_act_scale(x, bias, "relu", 0.5)),
        ("bias gelu", lambda: bias_act_scale(skewed, bias, "gelu", 1.5)),
        ("bias gelu backward", lambda: ops.autograd_bias_act_backward(x, bias, x, "gelu", 0.5)),
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_replayed_gpu_calls_match_the_jit_launch_bit_for_bit(monkeypatch, dtype):
    from torchkiln.kernels import _bias_act, _softmax

    caches = (_softmax._FORWARD_CACHE, _bias_act._FORWARD_CACHE, _bias_act._BACKWARD_CACHE,
              _bias_act._BIAS_GRAD_CACHE)  # fmt: skip
    for cache in caches:
        monkeypatch.setattr(cache, "entries", {})
    for name, call in _gpu_cases(dtype):
        monkeypatch.setattr(_launch_cache, "enabled", False)
        want = call()
        monkeypatch.setattr(_launch_cache, "enabled", True)
        first, again = call(), call()  # recorded (and checked), then replayed
        for got in (first, again):
            got, ref = (got, want) if isinstance(got, tuple) else ((got,), (want,))
            assert all(torch.equal(g, w) for g, w in zip(got, ref, strict=True)), name
    assert set(_launch_cache.status().values()) == {"ok"}, _launch_cache.status()
    replays = [r for cache in caches for r in cache.entries.values()]
    # Ten op bodies, the bias_act backward's two launches cached apart.
    assert len(replays) == 11 and all(r is not None for r in replays)


@pytest.mark.gpu
def test_replays_run_in_cuda_graphs_and_in_eager_training(monkeypatch):
    from torchkiln.kernels import _softmax

    for cache in (_softmax._FORWARD_CACHE, _softmax._BACKWARD_CACHE):
        monkeypatch.setattr(cache, "entries", {})
    monkeypatch.setattr(_launch_cache, "enabled", True)
    static = torch.randn(128, 1000, device="cuda")
    softmax(static), softmax(static)  # recorded, then replayed
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = softmax(static)  # a replay, captured
    fresh = torch.randn_like(static)
    static.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, softmax_ref(fresh), torch.float32, "replayed in a CUDA graph")
    # A key first seen while capturing takes the JIT launch and is not recorded (recording
    # checks its first replay with a synchronising comparison).
    other = torch.randn(16, 300, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = softmax(other)
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, softmax_ref(other), torch.float32, "first seen while capturing")
    assert not any(key[0] == other.shape for key in _softmax._FORWARD_CACHE.entries)
    # Eager training: the backward's body runs directly (autograd_softmax_backward), replayed
    # from its second call.
    for _ in range(3):
        x = static.clone().requires_grad_()
        dy = torch.randn_like(static)
        y = softmax(x)
        y.backward(dy)
        want = softmax_backward_ref(y.detach(), dy, 1.0)
        assert_close(x.grad, want, torch.float32, "eager backward")
    assert [r is not None for r in _softmax._BACKWARD_CACHE.entries.values()] == [True]
    # bias_act_scale's backward (a replayed launch, then the partial sums' column sum, also
    # replayed).
    from torchkiln.kernels import _bias_act

    monkeypatch.setattr(_bias_act._BACKWARD_CACHE, "entries", {})
    monkeypatch.setattr(_bias_act._BIAS_GRAD_CACHE, "entries", {})
    bias = torch.randn(1000, device="cuda")
    for _ in range(3):
        x, b = static.clone().requires_grad_(), bias.clone().requires_grad_()
        dy = torch.randn_like(static)
        bias_act_scale(x, b, "gelu", 0.5).backward(dy)
        dx, db = bias_act_backward_ref(static, bias, dy, "gelu", 0.5)
        dz_atol = GELU_ATOL * 0.5 * dy.abs().max().item()  # as test_bias_act_scale_gpu
        assert_close(x.grad, dx, torch.float32, "bias_act dx", atol=dz_atol)
        db_atol = sum_atol(dx, 128) + 128 * dz_atol
        assert_close(b.grad, db, torch.float32, "bias_act dbias", atol=db_atol)
    assert [r is not None for r in _bias_act._BACKWARD_CACHE.entries.values()] == [True]
    assert [r is not None for r in _bias_act._BIAS_GRAD_CACHE.entries.values()] == [True]
