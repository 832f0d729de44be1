"""BucketedModule on a tiny transformers BERT (random weights) and on toy modules.

Inductor compiles a bucket of this BERT in ~5-20 s on 2 CPU cores, so the Inductor tests keep to
two buckets; the tests about bucketing, guards and threads use dynamo with its "eager" backend,
which traces and guards exactly like Inductor but compiles in well under a second.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass

import pytest
import torch

from torchkiln.serve import BucketedModule, ServeConfigError
from torchkiln.serve.guard import compile_count
from torchkiln.variants import Backend, Variant

transformers = pytest.importorskip("transformers")

DIMS = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}


@dataclass(frozen=True)
class DynamoEager(Backend):
    """torch.compile(backend="eager"): dynamo's tracing, guards and recompiles, no codegen."""

    name = "dynamo-eager-test"

    def wrap(self, fn, *, compile_scope):
        return torch.compile(fn, backend="eager")


CHEAP = Variant(DynamoEager())


def tiny_bert():
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=128,
    )
    return transformers.BertModel(cfg).eval()


def request(b, s, gen):
    ids = torch.randint(1, 100, (b, s), generator=gen)
    mask = torch.ones(b, s, dtype=torch.long)
    mask[:, s - s // 3 :] = torch.randint(0, 2, (b, s // 3), generator=gen)  # some real padding
    return {"input_ids": ids, "attention_mask": mask}


def assert_matches_eager(model, served_out, inputs, atol):
    with torch.no_grad():
        ref = model(**inputs)
    b, s = inputs["input_ids"].shape
    assert served_out.last_hidden_state.shape == (b, s, 32)
    assert served_out.pooler_output.shape == (b, 32)
    torch.testing.assert_close(
        served_out.last_hidden_state, ref.last_hidden_state, atol=atol, rtol=0
    )
    torch.testing.assert_close(served_out.pooler_output, ref.pooler_output, atol=atol, rtol=0)


@pytest.fixture(scope="module")
def bert():
    return tiny_bert()


@pytest.fixture(scope="module")
def warmed(bert):
    """3 x 3 buckets, each its own specialisation: 9 cache entries, past dynamo's default
    recompile limit of 8, which BucketedModule must lift while it warms up."""
    served = BucketedModule(
        bert,
        DIMS,
        {"batch": [2, 4, 8], "seq": [16, 32, 64]},
        CHEAP,
        example_inputs=request(2, 8, torch.Generator().manual_seed(0)),
    )
    info = served.warmup()
    assert info["compilations"] >= 9 and info["unstable_buckets"] == {}
    yield served
    served.close()


@pytest.mark.parametrize("specialize", [None, ()], ids=["per-bucket", "shared-graph"])
def test_inductor_outputs_match_eager_on_real_positions(bert, specialize):
    buckets = (
        {"batch": [4], "seq": [16, 32]}
        if specialize is None
        else {"batch": [2, 4], "seq": [16, 32]}
    )
    served = BucketedModule(bert, DIMS, buckets, "inductor", specialize=specialize)
    gen = torch.Generator().manual_seed(1)
    info = served.warmup(**request(3, 10, gen))
    # Per bucket: one compilation each; shared: one graph dynamic in batch and seq.
    assert info["compilations"] == (2 if specialize is None else 1)
    rng = random.Random(1)
    for _ in range(10):
        inputs = request(rng.randint(1, 4), rng.randint(2, 32), gen)
        assert_matches_eager(bert, served(**inputs), inputs, atol=1e-4)
    stats = served.stats()
    assert stats["bucketed_requests"] == 10 and stats["eager_fallbacks"] == 0
    assert stats["recompiles_after_warmup"] == 0
    served.close()


def test_no_compilation_after_warmup_over_200_random_requests(bert, warmed):
    before, graphs = warmed.stats()["requests"], compile_count()
    rng, gen = random.Random(2), torch.Generator().manual_seed(2)
    for _ in range(200):
        inputs = request(rng.randint(1, 8), rng.randint(2, 64), gen)
        out = warmed(**inputs)
        assert out.last_hidden_state.shape[:2] == inputs["input_ids"].shape
    stats = warmed.stats()
    assert compile_count() == graphs
    assert stats["recompiles_after_warmup"] == 0
    assert stats["requests"] - before == 200 and stats["eager_fallbacks"] == 0
    assert sum(stats["hits"].values()) == stats["bucketed_requests"]
    assert 0 < stats["padding_waste"] < 3
    assert {"p50", "p99"} <= set(stats["latency_ms"]["batch=8,seq=64"])


def test_random_shapes_match_eager(bert, warmed):
    rng, gen = random.Random(3), torch.Generator().manual_seed(3)
    for _ in range(15):
        inputs = request(rng.randint(1, 8), rng.randint(2, 64), gen)
        assert_matches_eager(bert, warmed(**inputs), inputs, atol=1e-5)


def test_oversize_and_unseen_inputs_fall_back_to_eager_and_are_counted(bert, warmed):
    gen = torch.Generator().manual_seed(4)
    before = warmed.stats()["fallback_reasons"]
    graphs = compile_count()
    for inputs in (request(9, 8, gen), request(2, 65, gen)):
        assert_matches_eager(bert, warmed(**inputs), inputs, atol=0)
    wrong_dtype = request(2, 8, gen)
    wrong_dtype["input_ids"] = wrong_dtype["input_ids"].int()
    assert_matches_eager(bert, warmed(**wrong_dtype), wrong_dtype, atol=0)
    after = warmed.stats()["fallback_reasons"]
    assert after.get("oversize", 0) - before.get("oversize", 0) == 2
    assert after.get("dtype", 0) - before.get("dtype", 0) == 1
    assert "exceeds the largest bucket" in warmed.stats()["last_fallback"]["oversize"]
    assert compile_count() == graphs


def test_eight_threads_at_once_get_their_own_correct_results(bert, warmed):
    rng, gen = random.Random(5), torch.Generator().manual_seed(5)
    jobs = [
        [request(rng.randint(1, 8), rng.randint(2, 64), gen) for _ in range(6)] for _ in range(8)
    ]
    with torch.no_grad():
        expected = [[bert(**x).last_hidden_state for x in job] for job in jobs]
    results: dict[int, list[torch.Tensor]] = {}
    start = threading.Barrier(8)

    def worker(i):
        start.wait()  # all eight call at once
        results[i] = [warmed(**x).last_hidden_state for x in jobs[i]]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(8):
        for got, want in zip(results[i], expected[i], strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert warmed.stats()["recompiles_after_warmup"] == 0


def test_train_mode_and_padding_sensitive_layers_are_refused(bert):
    bert.train()
    try:
        with pytest.raises(ServeConfigError, match="training mode"):
            BucketedModule(bert, DIMS, {"batch": [2], "seq": [8]}, CHEAP)
    finally:
        bert.eval()
    batch_stats = torch.nn.Sequential(
        torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4, track_running_stats=False)
    ).eval()
    with pytest.raises(ServeConfigError, match="batch's own statistics"):
        BucketedModule(batch_stats, {0: {0: "batch"}}, {"batch": [4]}, CHEAP)


def test_a_model_switched_to_train_after_construction_is_refused_per_call():
    model = torch.nn.Linear(4, 2).eval()
    served = BucketedModule(model, {0: {0: "batch"}}, {"batch": [4]}, CHEAP)
    served.warmup(torch.randn(2, 4))
    model.train()
    with pytest.raises(ServeConfigError, match="training mode"):
        served(torch.randn(3, 4))
    served.close()


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.scale = 1.0  # dynamo guards on this constant

    def forward(self, x):
        return self.lin(x) * self.scale


@pytest.mark.parametrize("guard", ["stance", "config"])
def test_a_recompile_after_warmup_is_blocked_counted_and_served_eagerly(guard):
    model = Scaled().eval()
    served = BucketedModule(
        model, {0: {0: "batch"}}, {"batch": [2, 4]}, CHEAP, recompile_guard=guard
    )
    served.warmup(torch.randn(3, 4))
    x = torch.randn(3, 4)
    torch.testing.assert_close(served(x), model(x).detach())
    model.scale = 2.0  # invalidates the guard: running the compiled code would need a recompile
    graphs = compile_count()
    torch.testing.assert_close(served(x), model(x).detach())
    stats = served.stats()
    assert compile_count() == graphs
    assert stats["recompiles_after_warmup"] == 1
    assert stats["fallback_reasons"] == {"recompile": 1}
    served.close()


def test_unseen_rank_falls_back_to_eager():
    model = torch.nn.Linear(4, 3).eval()
    served = BucketedModule(
        model, {0: {0: "batch"}}, {"batch": [2, 4]}, CHEAP, example_inputs=(torch.randn(2, 4),)
    )
    served.warmup()
    x = torch.randn(3, 2, 4)  # Linear accepts it; the warmed-up code was for rank 2
    torch.testing.assert_close(served(x), model(x).detach())
    assert served.stats()["fallback_reasons"] == {"rank": 1}
    served.close()


def _mlp_class():
    # A fresh class per call: dynamo caches compiled code on the forward's code object, so two
    # instances of one class would share (and reuse) each other's compilations.
    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    return MLP


@pytest.mark.parametrize(("specialize", "graphs"), [((), 1), (["seq"], 2), (None, 6)])
def test_specialised_symbols_compile_once_per_size_and_the_rest_share_a_graph(specialize, graphs):
    model = _mlp_class()().eval()
    dims, buckets = {0: {0: "batch", 1: "seq"}}, {"batch": [2, 4, 8], "seq": [3, 6]}
    served = BucketedModule(model, dims, buckets, CHEAP, specialize=specialize)
    assert served.warmup(torch.randn(2, 3, 4))["compilations"] == graphs
    x = torch.randn(5, 4, 4)
    torch.testing.assert_close(served(x), model(x).detach())
    assert served.stats()["hits"] == {"batch=8,seq=6": 1}
    served.close()


def test_declared_output_dims_slice_outputs_the_dry_run_cannot_see():
    class Pair(torch.nn.Module):
        def forward(self, x):
            return x.sum(-1), x[:, :1] * 0  # 2nd output: batch x 1, whatever the width

    served = BucketedModule(
        Pair().eval(), {0: {0: "batch"}}, {"batch": [4]}, CHEAP, output_dims={0: "batch"}
    )
    served.warmup(torch.randn(2, 5))
    a, b = served(torch.randn(3, 5))
    assert a.shape == (3,) and b.shape == (3, 1)
    served.close()


def test_configuration_errors_name_the_fix(bert):
    with pytest.raises(ServeConfigError, match="exactly the declared symbols"):
        BucketedModule(bert, DIMS, {"batch": [2]}, CHEAP)
    with pytest.raises(ServeConfigError, match="unknown symbols"):
        BucketedModule(bert, DIMS, {"batch": [2], "seq": [8]}, CHEAP, specialize=["len"])
    served = BucketedModule(bert, DIMS, {"batch": [2], "seq": [8]}, CHEAP)
    with pytest.raises(ServeConfigError, match="needs an example"):
        served.warmup()
    served.close()


@pytest.mark.parametrize("has_initializer", [True, False], ids=["torch>=2.14", "older"])
def test_worker_threads_get_their_own_cudagraph_tree_state(monkeypatch, has_initializer):
    """Older torch asserts when CUDA-graph trees are used from a plain Python thread
    (pytorch#123177); the worker sets the per-thread state up itself."""
    from torch._inductor import cudagraph_trees as cgt

    from torchkiln.serve.worker import _init_cudagraph_tls

    main = cgt.get_obj(cgt.local, "tree_manager_containers")
    if not has_initializer:
        monkeypatch.delattr(cgt, "_initialize_tls", raising=False)
    seen = {}

    def body():
        _init_cudagraph_tls()
        seen["stashed"] = torch._C._is_key_in_tls("tree_manager_containers")
        seen["state"] = cgt.get_obj(cgt.local, "tree_manager_containers")

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen["stashed"] and isinstance(seen["state"], dict) and seen["state"] is not main
