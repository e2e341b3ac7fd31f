"""SDPA kernels for calls whose shapes change from one call to the next.

Decoding grows the KV length by one token per step, and the trainer's packed sequences
have new lengths every micro-batch. PyTorch's cuDNN SDPA backend (chosen first for bf16
on Hopper) builds an execution plan for each new shape, which costs far more than the
attention itself on such calls: measured on an H200 (bench/gpu_check.py, 2026-11-27),
bf16 greedy decoding in ``HFEngine`` ran at 120-186 tok/s with it and 2434 tok/s
without it, and the FSDP actor's first bf16 update took 3.3 s against 0.16 s. The
flash, memory-efficient and math kernels need no per-shape plan.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPE_FREE_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def varying_shape_attention() -> AbstractContextManager[None]:
    """Context (or decorator) in which SDPA never picks the per-shape-planned cuDNN backend."""
    return sdpa_kernel(SHAPE_FREE_BACKENDS)
