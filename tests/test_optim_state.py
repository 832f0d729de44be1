"""Creating the optimizer state ahead of a compiled whole step leaves the training unchanged."""

import pytest

torch = pytest.importorskip("torch")

from torchkiln.runner.protocol.optim_state import (  # noqa: E402
    CannotPrime,
    prime_optimizer_state,
    prime_reason,
)

OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
    "sgd-nesterov": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.01, amsgrad=True),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.5, centered=True),
}


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _train(model, opt, steps=3):
    x = torch.randn(4, 7, generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_primed_state_trains_exactly_as_a_fresh_one(name):
    fresh, primed = _model(), _model()
    opt_f, opt_p = OPTIMIZERS[name](fresh.parameters()), OPTIMIZERS[name](primed.parameters())
    created = prime_optimizer_state(opt_p)
    assert created >= 4  # one or more state tensors for each of the four parameters
    assert all(opt_p.state[p] for p in primed.parameters())
    # Priming moved no weight (weight decay would, on a zero gradient, had it not been undone).
    for a, b in zip(fresh.parameters(), primed.parameters(), strict=True):
        assert torch.equal(a, b) and b.grad is None
    _train(fresh, opt_f)
    _train(primed, opt_p)
    for a, b in zip(fresh.parameters(), primed.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_priming_twice_creates_nothing_more():
    model = _model()
    opt = OPTIMIZERS["adam"](model.parameters())
    assert prime_optimizer_state(opt) > 0
    assert prime_optimizer_state(opt) == 0


def test_optimizers_that_would_step_differently_are_refused_with_the_reason():
    model = _model()
    damped = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.5)
    assert "dampening=0.5" in prime_reason(damped)
    with pytest.raises(CannotPrime, match="dampening"):
        prime_optimizer_state(damped)
    adagrad = torch.optim.Adagrad(model.parameters(), lr=0.1)
    with pytest.raises(CannotPrime, match="Adagrad: kiln creates the optimizer state ahead only"):
        prime_optimizer_state(adagrad)
    assert not any(damped.state.values())  # nothing was stepped


def test_the_whole_step_under_cuda_graphs_refuses_an_optimizer_it_cannot_prime():
    from torchkiln.runner.protocol.executable import _prime_for_step_scope
    from torchkiln.variants import parse_variant

    graphs = parse_variant("inductor:mode=reduce-overhead,scope=step").backend
    plain = parse_variant("inductor:scope=step").backend
    model = _model()
    adagrad = torch.optim.Adagrad(model.parameters(), lr=0.1)
    with pytest.raises(CannotPrime, match="scope=step under CUDA graphs needs the optimizer"):
        _prime_for_step_scope(adagrad, graphs, "cuda")
    # Without CUDA graphs (or off CUDA) it is left to make its state inside the step, as before.
    _prime_for_step_scope(adagrad, plain, "cuda")
    _prime_for_step_scope(adagrad, graphs, "cpu")
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _prime_for_step_scope(sgd, graphs, "cuda")  # only a device string: nothing runs on a GPU
    assert all("momentum_buffer" in sgd.state[p] for p in model.parameters())
