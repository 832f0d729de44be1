"""Python for a pick a tune made on a training stream: the compiled model inside a training loop
over a padding-free loader, and for a bucketed pick the padding the loader does."""

from __future__ import annotations

from typing import Any

from torchkiln.runner.protocol.arm_facts import arm_facts
from torchkiln.tune.recommend import _compile_args
from torchkiln.variants import parse_variant


def _pad_lines(metrics: dict[str, Any], bucket: str) -> list[str]:
    dims: dict[Any, dict[int, str]] = {}
    for key, dim, sym in metrics.get("varying_dims") or []:
        dims.setdefault(key, {})[dim] = sym
    buckets = {k: tuple(b) for k, b in (metrics.get("buckets") or {}).items()}
    return [
        "import bisect",
        "",
        f"# inputs padded up to a bucket ({bucket}) in the data path: one graph per bucket",
        f"BUCKETS = {buckets!r}",
        f"DYNAMIC_DIMS = {dims!r}",
        "# each input padded with what leaves the loss unchanged (the workload's pad_values)",
        f"PAD = {metrics.get('pad_values') or {}!r}",
        "",
        "",
        "def pad_batch(batch):",
        "    out = dict(batch)",
        "    for key, dims in DYNAMIC_DIMS.items():",
        "        t = batch[key]",
        "        shape = list(t.shape)",
        "        for d, sym in dims.items():",
        "            b = BUCKETS[sym]",
        "            shape[d] = b[bisect.bisect_left(b, t.shape[d])]",
        "        padded = t.new_full(shape, PAD[key])",
        "        padded[tuple(slice(0, n) for n in t.shape)] = t",
        "        out[key] = padded",
        "    return out",
        "",
        "",
        "# warm up: one training step per bucket before the run (or accept one compile per bucket",
        "# on first sight); after that nothing compiles",
    ]


def train_stream_code(name: str, metrics: dict[str, Any], device: str) -> str:
    """The torch.compile call the pick was measured with (its dynamic setting, raised recompile
    limit, autocast and GradScaler), in a training loop over the stream's batches."""
    from torchkiln.tune.stream_plan import parse_stream_candidate

    if name == "eager":
        return "\n".join(
            [f'model = model.to("{device}").train()', "run = model  # no compilation paid off"]
        )
    c = parse_stream_candidate(name)
    v = parse_variant(c.variant)
    f = arm_facts(v, "train", device)
    lines = ["import torch", ""]
    if c.bucket:
        lines += _pad_lines(metrics, c.bucket)
    lines.append(f'model = model.to("{device}").train()')
    if c.recompile_limit:
        lines += [
            "# one graph per batch shape: allow as many as the data has",
            'limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") '
            'else "cache_size_limit"',
            f"setattr(torch._dynamo.config, limit, {c.recompile_limit})",
        ]
    args = _compile_args(v)
    lines.append(f"run = torch.compile(model{', ' + args if args else ''})")
    if f.grad_scaler:
        lines.append(f'scaler = torch.amp.GradScaler("{f.device_type}")')
    autocast = (
        f'torch.autocast("{f.device_type}", dtype=torch.{f.autocast_dtype})'
        if f.autocast_dtype
        else None
    )
    body = ["for batch in loader:  # dicts of tensors, sequence length varying"]
    if c.bucket:
        body.append("    batch = pad_batch(batch)")
    if autocast:
        body += [f"    with {autocast}:", "        loss = run(**batch).loss"]
    else:
        body.append("    loss = run(**batch).loss  # or your loss of the outputs")
    if f.grad_scaler:
        body += [
            "    scaler.scale(loss).backward()",
            "    scaler.step(optimizer)",
            "    scaler.update()",
        ]
    else:
        body += ["    loss.backward()", "    optimizer.step()"]
    body.append("    optimizer.zero_grad(set_to_none=True)")
    return "\n".join([*lines, "", *body])
