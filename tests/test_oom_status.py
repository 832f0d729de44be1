"""A refused allocation is `oom` (retried by a later run), not `runtime_error`."""

from __future__ import annotations

import pytest

from torchkiln.runner.protocol.worker import classify_error

CPU_REFUSAL = (
    "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
    "you tried to allocate 1125899906842624 bytes. Error code 12 (Cannot allocate memory)"
)


@pytest.mark.parametrize("message", [CPU_REFUSAL, "not enough memory: you tried to allocate"])
def test_a_refused_cpu_allocation_is_oom(message):
    assert classify_error(RuntimeError(message), "measure") == "oom"


def test_a_refusal_wrapped_by_the_compiler_is_oom():
    class InductorError(Exception):
        pass

    InductorError.__module__ = "torch._inductor.exc"
    try:
        try:
            raise RuntimeError(CPU_REFUSAL)
        except RuntimeError as inner:
            raise InductorError("compiled forward failed") from inner
    except InductorError as exc:
        assert classify_error(exc, "first_call") == "oom"


def test_other_runtime_errors_stay_runtime_errors():
    assert classify_error(RuntimeError("shape mismatch"), "measure") == "runtime_error"


@pytest.mark.slow
def test_an_allocation_refused_inside_a_compiled_forward_is_oom():
    import torch

    @torch.compile
    def huge(x):  # a 2**24 x 2**24 fp32 product: 4 PiB, refused by any host
        return torch.mm(x.expand(2**24, 3), x.view(3, 1).expand(3, 2**24))

    with pytest.raises(Exception) as info:
        huge(torch.ones(3))
    assert classify_error(info.value, "first_call") == "oom"
