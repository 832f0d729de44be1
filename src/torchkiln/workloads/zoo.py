"""Built-in workloads. Random weights and random inputs: nothing is downloaded at run time."""

from __future__ import annotations

from typing import Any

from torchkiln.errors import require
from torchkiln.workloads.base import Workload, register_workload

# (batch, spatial size or sequence length) per preset; `tiny` keeps the model and the code path
# and shrinks only what makes a CPU run slow.
_SIZES = {
    "simple": {"full": (32, 224), "tiny": (4, 32)},
    "resnet50": {"full": (32, 224), "tiny": (2, 64)},
    "bert-base": {"full": (16, 128), "tiny": (2, 32)},
    "gpt2": {"full": (8, 512), "tiny": (2, 32)},
}


def _size(name: str, preset: str, batch_size: int | None) -> tuple[int, int]:
    if preset not in _SIZES[name]:
        raise ValueError(f"preset={preset!r}; choose from {sorted(_SIZES[name])}")
    batch, size = _SIZES[name][preset]
    return (batch_size or batch), size


def _image_workload(
    name: str, model: Any, batch: int, size: int, classes: int, step: str, desc: str
) -> Workload:
    import torch

    images = torch.randn(batch, 3, size, size)
    labels = torch.randint(0, classes, (batch,))
    return Workload(
        model=model,
        example_inputs=(images,),
        name=name,
        step=step,
        targets=labels,
        description=desc,
        convolutional=True,
        meta={"batch": batch, "resolution": size},
    )


class SimpleCNN:  # the nn.Module subclass lives in simple_cnn.py, imported once torch is
    @staticmethod
    def build(classes: int = 10):
        from torchkiln.workloads.simple_cnn import Simple

        return Simple(classes)


@register_workload("simple", description="small CNN (2 conv + BN + ReLU, pool, linear), 224x224")
def simple(preset: str = "full", batch_size: int | None = None, step: str = "infer") -> Workload:
    batch, size = _size("simple", preset, batch_size)
    w = _image_workload("simple", SimpleCNN.build(10), batch, size, 10, step, "classic small CNN")
    return _with_image_stream(w, batch, (size * 3 // 4, size, size * 5 // 4))


@register_workload("resnet50", description="torchvision ResNet-50, random weights", extra="vision")
def resnet50(preset: str = "full", batch_size: int | None = None, step: str = "infer") -> Workload:
    tv_models = require("torchvision.models", "vision", "the resnet50 workload")
    batch, size = _size("resnet50", preset, batch_size)
    model = tv_models.resnet50(weights=None)
    w = _image_workload("resnet50", model, batch, size, 1000, step, "ResNet-50")
    return _with_image_stream(w, batch, (160, 192, 224, 256, 288))


def _with_image_stream(w: Workload, batch: int, sides: tuple[int, ...]) -> Workload:
    """Inputs for ``batch`` images of ``side`` x ``side``; the default stream mixes resolutions."""
    import torch

    from torchkiln.workloads.stream import mixed_resolution_sizes

    w.make_inputs = lambda batch, side: (torch.randn(batch, 3, side, side),)
    w.default_sizes = lambda n: mixed_resolution_sizes(n, batch=batch, sides=sides)
    return w


@register_workload(
    "bert-base",
    description="transformers BertForSequenceClassification(BertConfig()), random weights",
    extra="nlp",
)
def bert_base(preset: str = "full", batch_size: int | None = None, step: str = "infer") -> Workload:
    import torch

    transformers = require("transformers", "nlp", "the bert-base workload")
    batch, seq = _size("bert-base", preset, batch_size)
    config = transformers.BertConfig()
    model = transformers.BertForSequenceClassification(config)
    inputs: dict[str, Any] = {
        "input_ids": torch.randint(0, config.vocab_size, (batch, seq)),
        "attention_mask": torch.ones(batch, seq, dtype=torch.long),
    }
    if step == "train":
        inputs["labels"] = torch.randint(0, config.num_labels, (batch,))

    def make_inputs(batch: int, seq: int) -> dict[str, Any]:
        x = {
            "input_ids": torch.randint(0, config.vocab_size, (batch, seq)),
            "attention_mask": torch.ones(batch, seq, dtype=torch.long),
        }
        if step == "train":  # a training stream's items carry their labels
            x["labels"] = torch.randint(0, config.num_labels, (batch,))
        return x

    from torchkiln.workloads.stream import lognormal_seq_sizes

    return Workload(
        make_inputs=make_inputs,
        size_limits={"seq": config.max_position_embeddings},
        default_sizes=lambda n: lognormal_seq_sizes(
            n, batch=batch, max_seq=config.max_position_embeddings
        ),
        model=model,
        example_inputs=inputs,
        name="bert-base",
        step=step,
        description="BERT-base sequence classification",
        # padded tokens are masked out of attention, and padded rows' labels are the ignore
        # index of the classifier's cross-entropy: padding leaves the loss as it was
        pad_values={"input_ids": 0, "attention_mask": 0, "labels": -100},
        meta={"batch": batch, "seq_len": seq},
    )


@register_workload(
    "gpt2",
    description="transformers GPT2LMHeadModel(GPT2Config()), use_cache off, random weights",
    extra="nlp",
)
def gpt2(preset: str = "full", batch_size: int | None = None, step: str = "infer") -> Workload:
    """GPT-2 small as a decoder over whole sequences: ``use_cache = False``, so the output is the
    logits alone (a key/value cache in the output is what torch.export refuses, and inference on
    a stream of whole sequences never reads it back)."""
    import torch

    transformers = require("transformers", "nlp", "the gpt2 workload")
    batch, seq = _size("gpt2", preset, batch_size)
    if preset == "tiny":
        # the same decoder, narrow and shallow; 256 positions keep its longest stream item
        # quick on a CPU
        config = transformers.GPT2Config(
            n_layer=2, n_head=2, n_embd=64, vocab_size=512, n_positions=256,
            bos_token_id=511, eos_token_id=511,
        )  # fmt: skip
    else:
        config = transformers.GPT2Config()
    config.use_cache = False
    model = transformers.GPT2LMHeadModel(config)

    def make_inputs(batch: int, seq: int) -> dict[str, Any]:
        return {"input_ids": torch.randint(0, config.vocab_size, (batch, seq))}

    inputs = make_inputs(batch, seq)
    if step == "train":
        inputs["labels"] = inputs["input_ids"].clone()  # next-token loss, shifted by the model

    from torchkiln.workloads.stream import lognormal_seq_sizes

    return Workload(
        make_inputs=make_inputs,
        size_limits={"seq": config.n_positions},
        default_sizes=lambda n: lognormal_seq_sizes(n, batch=batch, max_seq=config.n_positions),
        model=model,
        example_inputs=inputs,
        name="gpt2",
        step=step,
        description="GPT-2 small causal LM, use_cache off",
        meta={"batch": batch, "seq_len": seq},
    )


from torchkiln.workloads import real as _real  # noqa: E402,F401  (registers the zoo of real models)
