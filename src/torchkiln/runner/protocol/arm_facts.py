"""What a trial's arm does to the model besides compiling it, as facts: the arm builder
(runner/protocol/executable.py) takes these steps and the recommendation (tune/recommend.py) prints
them, so the code a user pastes runs the model the trial measured (a model built from a config
starts in train mode, dropout on: a trial of an inference step calls `model.eval()`, and so
must the pasted code)."""

from __future__ import annotations

from dataclasses import dataclass

from torchkiln.variants import Variant

AUTOCAST_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class ArmFacts:
    step: str  # "infer" | "train"
    device: str  # "cuda", "cuda:1", "cpu"
    eval_mode: bool  # model.eval() (inference) or model.train() (training)
    no_grad: bool  # the inference step runs under torch.no_grad()
    channels_last: bool  # model and 4-D floating inputs in channels_last
    autocast_dtype: str | None  # torch.autocast dtype name, None for none
    tf32: bool  # TF32 matmuls and convolutions on (the tf32 policy; off otherwise)
    grad_scaler: bool  # fp16 training scales the loss
    whole_step: bool  # the training step, optimizer included, is what is compiled
    eager_first_step: bool  # the optimizer makes its state before the compiled step runs

    @property
    def device_type(self) -> str:
        return self.device.split(":")[0]


def arm_facts(variant: Variant, step: str, device: str) -> ArmFacts:
    train = step == "train"
    whole_step = variant.backend.scope == "step"
    return ArmFacts(
        step=step,
        device=device,
        eval_mode=not train,
        no_grad=not train,
        channels_last=variant.channels_last,
        autocast_dtype=AUTOCAST_DTYPES.get(variant.precision),
        tf32=variant.precision == "tf32",
        grad_scaler=train and variant.precision == "fp16",
        whole_step=whole_step,
        # runner/protocol/optim_state.py creates the state ahead of the compiled step; a user
        # does the same by running the first step eagerly.
        eager_first_step=train and whole_step,
    )
