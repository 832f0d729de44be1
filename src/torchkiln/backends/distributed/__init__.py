"""Distributed training trials (DDP, FSDP) through torchrun: `config` checks --dist and
--nproc, `launch` starts the ranks and merges their results, `worker` is one rank, `arm` wraps
the model, `comm` measures communication."""
