"""What `kiln kernels bench` measures, by name: plain names, so that building the CLI parser
imports neither torch nor triton, and the cases (`_cases`) and the sweep (`bench`) share them."""

KERNELS = ("softmax", "masked_softmax", "bias_act_scale")
DIRECTIONS = ("fwd", "bwd")
DTYPE_NAMES = ("fp32", "bf16", "fp16")
