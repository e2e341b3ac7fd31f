"""Configuration of the FSDP2 training workers: actor, reference and critic.

``WorkersConfig`` is the section the trainer reads; the model location and dtype of
the weights on disk come from the global ``model`` section and are passed to the
workers separately.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Section(BaseModel):
    """Unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class OptimConfig(_Section):
    """AdamW and its learning-rate schedule (indexed by training step = one update call)."""

    lr: float = Field(1e-6, gt=0, description="Peak learning rate of AdamW.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    weight_decay: float = Field(0.01, ge=0, description="AdamW decoupled weight decay.")
    grad_clip: float = Field(
        1.0, gt=0, description="Clip the global gradient norm to this value before each step."
    )
    schedule: Literal["constant", "cosine"] = Field(
        "constant", description="LR after warmup: `constant` or `cosine` decay to min_lr_ratio."
    )
    warmup_steps: int = Field(
        0,
        ge=0,
        description="Training steps of linear warmup (step s uses lr·(s+1)/warmup_steps).",
    )
    min_lr_ratio: float = Field(
        0.0, ge=0, le=1, description="Cosine: final LR as a fraction of `lr`."
    )


class FSDPConfig(_Section):
    """How one model is sharded and computed on its ranks."""

    param_dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="Dtype of the unsharded parameters in forward/backward (bfloat16 = mixed "
        "precision on GPU; master weights and optimizer state stay float32).",
    )
    reduce_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Dtype of the gradient reduce-scatter across ranks."
    )
    reshard_after_forward: bool = Field(
        True,
        description="Free each layer's gathered parameters after forward (ZeRO-3) instead of "
        "keeping them for backward (ZeRO-2, more memory, less communication).",
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute decoder-layer activations in backward to save memory."
    )
    attn_implementation: str = Field(
        "packed_sdpa",
        description="HF attention kernel: `packed_sdpa` (SDPA on each packed sequence "
        "alone), `sdpa` (one masked SDPA over the whole packed micro-batch: cost grows "
        "with its squared length), `eager`, `flash_attention_2`; all of them keep the "
        "packed sequences of a micro-batch apart.",
    )
    cpu_threads_per_rank: int = Field(
        1, ge=1, description="torch intra-op threads per rank when running on CPU."
    )


class LoRAConfig(_Section):
    """Low-rank adapters via `peft` (rank 0 = full fine-tuning)."""

    rank: int = Field(0, ge=0, description="LoRA rank; 0 disables LoRA.")
    alpha: float = Field(16.0, gt=0, description="LoRA alpha (scaling = alpha / rank).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the LoRA input.")
    target_modules: list[str] | str = Field(
        "all-linear",
        description="Module names to adapt, or `all-linear` (every linear but the LM head).",
    )


class _WorkerSection(_Section):
    """Placement and forward settings shared by every role."""

    world_size: int = Field(1, ge=1, description="FSDP ranks (Ray actors) of this role.")
    num_cpus_per_worker: float = Field(1.0, ge=0, description="Ray CPUs reserved per rank.")
    num_gpus_per_worker: float | None = Field(
        None,
        description="Ray GPUs per rank; None = 1 when the cluster has GPUs, else 0. Fractions "
        "let roles share a GPU.",
    )
    max_tokens_per_micro_batch: int = Field(
        8192,
        ge=1,
        description="Token budget of one packed forward (per rank); a sequence longer than "
        "the budget runs alone.",
    )
    seed: int = Field(
        0, description="torch seed of every rank (the same on all, so random inits agree)."
    )
    fsdp: FSDPConfig = Field(default_factory=FSDPConfig)


class _TrainableSection(_WorkerSection):
    """Optimisation settings shared by the actor and the critic."""

    mini_batch_size: int = Field(
        256,
        ge=1,
        description="Sequences per optimizer step (all ranks together); a batch of B "
        "sequences gives max(1, B // mini_batch_size) steps per epoch.",
    )
    epochs: int = Field(1, ge=1, description="Passes over the batch per update call.")
    optim: OptimConfig = Field(default_factory=OptimConfig)


class ActorConfig(_TrainableSection):
    """The policy being trained."""

    lora: LoRAConfig = Field(default_factory=LoRAConfig)
    log_prob_max_tokens_per_micro_batch: int | None = Field(
        None,
        ge=1,
        description="Token budget of one forward in compute_log_prob (no activations kept, "
        "so it can be larger); None = max_tokens_per_micro_batch.",
    )
    weight_sync_bucket_mb: float = Field(
        512.0, gt=0, description="Size of one bucket of gathered weights sent to the servers."
    )


class ReferenceConfig(_WorkerSection):
    """The frozen reference policy (KL penalty or loss)."""


class CriticConfig(_TrainableSection):
    """Value model: the policy backbone with a scalar head."""

    model_path: str | None = Field(
        None, description="Backbone checkpoint; None = the policy's `model.path`."
    )
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-5))


class WorkersConfig(_Section):
    """The training workers of one run."""

    actor: ActorConfig = Field(default_factory=ActorConfig)
    ref: ReferenceConfig = Field(default_factory=ReferenceConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
