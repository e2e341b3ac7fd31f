"""The simulated trainer's time model (``workers.backend=sim``).

The model and GPU come from the simulated engine's profiles
(:mod:`agentrl.server.sim_profiles`), so one profile names both sides of a simulated
cluster. A training pass over sequences of lengths ``L_i`` costs the forward FLOPs of
Kaplan et al. 2020 ("Scaling Laws for Neural Language Models", section 2.1), summed
over the causal positions::

    forward_flops = sum_i (2 * params * L_i + 2 * layers * d_attn * L_i (L_i + 1) / 2)
    t_pass        = forward_flops / (num_gpus * bf16_flops * mfu)

A backward pass costs two forwards (Kaplan's 6N per trained token), so an update is
three passes per epoch, four with gradient checkpointing (the recomputed forward). The
reference, the old-log-prob recompute and the critic's values are one pass each; the
critic's update three. All roles share the ``num_gpus`` training GPUs, one after the
other, as colocated FSDP roles do.

A weight push gathers the full weights on the trainer's first GPU over NVLink, then
sends them to the rollout replicas over the network (a pipelined broadcast, whose time
does not grow with the number of receivers)::

    t_push = weight_bytes / nvlink_bandwidth + weight_bytes / push_bandwidth

Plain Python (no torch): the config validates against it. ``docs/concepts/simulation.md``
gives the source of every constant.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from agentrl.server.sim_profiles import GB, SimProfile, get_profile

TRAINING_MFU = 0.4
"""Model FLOPs utilization of a training pass: Meta's Llama 3 training reached 38-43% BF16
MFU on H100s ("The Llama 3 Herd of Models", 2024, table 4); variable-length RL batches
on FSDP reach that at best, so it is an upper estimate."""

PUSH_BANDWIDTH = 40e9
"""Bytes/s a weight push reaches from the trainer to the replicas: one ConnectX-7 NDR
400 Gb/s (50 GB/s) adapter per GPU (NVIDIA DGX H100/H200 datasheet), at an NCCL
efficiency of 0.8 (estimate)."""

TRAINING_BYTES_PER_PARAM = 16
"""GPU memory per trained parameter for mixed-precision AdamW: bf16 weights and
gradients (2 + 2) plus fp32 master weights, momentum and variance (12), sharded across
the GPUs (ZeRO stage 3; Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models", section 3.1)."""

FROZEN_BYTES_PER_PARAM = 2
"""GPU memory per parameter of the frozen reference (bf16 weights only)."""


@dataclass(frozen=True)
class TrainerTimeModel:
    """Modeled seconds of the training side of a simulated cluster.

    Raises ``ValueError`` when the roles' model states do not fit ``num_gpus`` GPUs.
    """

    profile: SimProfile
    num_gpus: int
    mfu: float = TRAINING_MFU
    push_bandwidth: float = PUSH_BANDWIDTH
    with_ref: bool = False
    with_critic: bool = False

    def __post_init__(self) -> None:
        if self.num_gpus < 1 or not 0 < self.mfu <= 1 or self.push_bandwidth <= 0:
            raise ValueError(
                f"workers.sim: num_gpus={self.num_gpus} must be >= 1, mfu={self.mfu} in "
                f"(0, 1] and push_bandwidth={self.push_bandwidth} > 0"
            )
        gpu = self.profile.gpu
        per_gpu = gpu.memory_bytes - self.profile.runtime_reserve_bytes
        needed = self.state_bytes
        if needed > per_gpu * self.num_gpus:
            least = -(-needed // per_gpu)
            raise ValueError(
                f"workers.sim.num_gpus={self.num_gpus} cannot hold the training state of "
                f"profile {self.profile.name!r} ({self._roles()}): {needed / GB:.1f} GB "
                f"({TRAINING_BYTES_PER_PARAM} bytes per trained parameter, ZeRO-3 sharded), "
                f"{per_gpu / GB:.0f} GB per {gpu.name} after the runtime reserve; use "
                f"workers.sim.num_gpus >= {int(least)}"
            )

    @classmethod
    def named(cls, profile: str, num_gpus: int, **kwargs: float | bool) -> TrainerTimeModel:
        """The model of profile ``profile`` (a ValueError lists the available ones)."""
        return cls(get_profile(profile), num_gpus, **kwargs)

    @property
    def state_bytes(self) -> float:
        """GPU memory of the model states: the actor's and critic's weights, gradients
        and optimizer state, the reference's weights."""
        params = self.profile.model.params
        trained = 2 if self.with_critic else 1
        frozen = FROZEN_BYTES_PER_PARAM if self.with_ref else 0
        return params * (trained * TRAINING_BYTES_PER_PARAM + frozen)

    def _roles(self) -> str:
        roles = [
            "actor",
            "reference" if self.with_ref else "",
            "critic" if self.with_critic else "",
        ]
        return " + ".join(r for r in roles if r)

    def forward_flops(self, lengths: Iterable[int]) -> float:
        """FLOPs of one forward pass over sequences of ``lengths`` tokens."""
        m = self.profile.model
        total = pairs = 0
        for length in lengths:
            total += length
            pairs += length * (length + 1) // 2
        return 2 * m.params * total + 2 * m.num_layers * m.attention_width * pairs

    def pass_s(self, lengths: Iterable[int], passes: float = 1.0) -> float:
        """Seconds of ``passes`` forward-equivalents over ``lengths`` on all training GPUs."""
        peak = self.num_gpus * self.profile.gpu.bf16_flops * self.mfu
        return passes * self.forward_flops(lengths) / peak

    @staticmethod
    def update_passes(epochs: int, gradient_checkpointing: bool) -> int:
        """Forward-equivalents of an update: forward + backward (3), plus the recomputed
        forward under gradient checkpointing, per epoch."""
        return epochs * (4 if gradient_checkpointing else 3)

    def push_s(self) -> float:
        """Seconds of one weight push: gather over NVLink, then send over the network."""
        weights = self.profile.model.weight_bytes
        return weights / self.profile.gpu.nvlink_bandwidth + weights / self.push_bandwidth
