"""The `xla` backend: torchax + jax.jit. `config` is its registry entry; `arm` builds its arm,
`protocol` measures it apart from PyTorch, `compare` sets it beside Inductor in a report."""
