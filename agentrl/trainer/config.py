"""The trainer's sections: ``trainer`` (the fit loop) and ``workers`` (FSDP2 ranks).

``WorkersConfig`` configures the actor, reference and critic workers; the model location
and dtype of the weights on disk come from the core ``model`` section and are passed to
the workers separately. Pydantic only: importing this module loads no trainer code.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from agentrl.core.config import Section
from agentrl.server.sim_profiles import PROFILES, get_profile
from agentrl.trainer.sim_model import PUSH_BANDWIDTH, TRAINING_MFU, TrainerTimeModel


class OptimConfig(Section):
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


class FSDPConfig(Section):
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


class LoRAConfig(Section):
    """Low-rank adapters via `peft` (rank 0 = full fine-tuning)."""

    rank: int = Field(0, ge=0, description="LoRA rank; 0 disables LoRA.")
    alpha: float = Field(16.0, gt=0, description="LoRA alpha (scaling = alpha / rank).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the LoRA input.")
    target_modules: list[str] | str = Field(
        "all-linear",
        description="Module names to adapt, or `all-linear` (every linear but the LM head).",
    )


class _WorkerSection(Section):
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


class ReferenceConfig(_WorkerSection):
    """The frozen reference policy (KL penalty or loss)."""


class CriticConfig(_TrainableSection):
    """Value model: the policy backbone with a scalar head."""

    model_path: str | None = Field(
        None, description="Backbone checkpoint; None = the policy's `model.path`."
    )
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-5))


class SimTrainerConfig(Section):
    """The simulated trainer (``workers.backend=sim``): docs/concepts/simulation.md."""

    profile: str = Field(
        "qwen2.5-7b-h100",
        description=f"The model/GPU setup whose training time is modeled: "
        f"{', '.join(PROFILES)} (agentrl.server.sim_profiles, shared with the simulated "
        "engine).",
    )
    num_gpus: int = Field(
        8,
        ge=1,
        description="Training GPUs modeled; the actor, reference and critic share them. "
        "They must hold the model states (16 bytes per trained parameter, ZeRO-3).",
    )
    mfu: float = Field(
        TRAINING_MFU,
        gt=0,
        le=1,
        description="Model FLOPs utilization of a training pass (the default: Llama 3's "
        "38-43% on H100s, an upper estimate).",
    )
    push_bandwidth: float = Field(
        PUSH_BANDWIDTH,
        gt=0,
        description="Bytes/s of a weight push from the trainer to the replicas (the "
        "default: one 400 Gb/s NIC per GPU at 0.8 NCCL efficiency).",
    )
    time_scale: float | None = Field(
        None,
        gt=0,
        description="Wall seconds slept per modeled second; None = "
        "server.engine.sim.time_scale, so both sides of the cluster run at one speed.",
    )

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, value: str) -> str:
        get_profile(value)  # a ValueError lists the available ones
        return value

    def time_model(self, *, with_ref: bool = False, with_critic: bool = False) -> TrainerTimeModel:
        """The time model of these settings for the roles a run trains."""
        return TrainerTimeModel(
            get_profile(self.profile),
            self.num_gpus,
            mfu=self.mfu,
            push_bandwidth=self.push_bandwidth,
            with_ref=with_ref,
            with_critic=with_critic,
        )


class WorkersConfig(Section):
    """The training workers of one run."""

    backend: Literal["fsdp", "sim"] = Field(
        "fsdp",
        description="`fsdp` (FSDP2 ranks as Ray actors) or `sim` (no model and no ranks: "
        "each step sleeps the GPU time `sim` models from its trained tokens, and the real "
        "queue, staleness control, weight versions and checkpoints run around it).",
    )
    actor: ActorConfig = Field(default_factory=ActorConfig)
    ref: ReferenceConfig = Field(default_factory=ReferenceConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    sim: SimTrainerConfig = Field(
        default_factory=SimTrainerConfig,
        description="The simulated trainer (`backend=sim`): profile, GPUs, MFU, push bandwidth.",
    )

    @model_validator(mode="after")
    def _sim_actor_fits(self) -> WorkersConfig:
        """``backend=sim``: the actor's model states fit the modeled GPUs (the reference
        and critic are checked when the trainer starts, which knows the algorithm)."""
        if self.backend == "sim":
            self.sim.time_model()
        return self


class TrainerConfig(Section):
    total_steps: int = Field(20, ge=1, description="Training steps (policy updates).")
    run_dir: str = Field(
        "runs/latest",
        description="Run directory: config, metrics, checkpoints, samples. Unset, a config "
        "loaded from a file runs in runs/<file name without .yaml> (recipes/x/cpu.yaml: "
        "runs/cpu).",
    )
    val_every: int = Field(
        0, ge=0, description="Validate every N steps (and before the first); 0 = never."
    )
    val_n: int = Field(1, ge=1, description="Samples per validation prompt (mean@k).")
    val_temperature: float = Field(0.0, ge=0, description="Validation sampling temperature.")
    save_every: int = Field(0, ge=0, description="Checkpoint every N steps; 0 = only at the end.")
    resume: bool = Field(
        True,
        description="Resume from the run directory's last checkpoint. A run whose last "
        "checkpoint is at total_steps is finished: it stops with a message (raise "
        "total_steps to train further).",
    )
    resume_mismatch: Literal["error", "allow"] = Field(
        "error",
        description="Resuming a run directory whose run had another model, tokenizer, "
        "train data, advantage estimator, policy loss, agent loop, reward function or LoRA "
        "rank: `error` stops and names the differing keys; `allow` resumes its checkpoint "
        "with the new settings.",
    )
    old_log_probs: Literal["recompute", "rollout"] = Field(
        "recompute",
        description="Behaviour log-probs for the PPO ratio: recomputed by the actor before "
        "the update, or the rollout engine's own (skips a forward pass).",
    )
    mismatch_probe_every: int = Field(
        1,
        ge=0,
        description="old_log_probs=rollout: every N steps (0 = never), after the weight "
        "push, the replicas answer a few of the step's prompts and the actor recomputes "
        "the log-probs of those tokens to measure the rollout/training mismatch "
        "(`mismatch/` metrics; the answers are never trained). "
        "old_log_probs=recompute measures it on every batch.",
    )
    mismatch_probe_rows: int = Field(
        8,
        ge=1,
        description="Answers the mismatch probe asks for (mismatch_probe_every; at least "
        "one per actor rank).",
    )
    max_staleness: int = Field(
        1,
        ge=0,
        description="Async training: how many policy versions rollouts may run ahead "
        "(0 = synchronous, 1 = one-step-off-policy).",
    )
    stale_policy: Literal["drop", "downweight"] = Field(
        "drop", description="What to do with episodes more than max_staleness versions old."
    )
    oversample_groups: int = Field(
        0,
        ge=0,
        description="Async training: groups the producer may run beyond what the staleness "
        "rule allows, so that a step takes the first `data.train_batch_size` groups to "
        "finish and a long-tail episode does not hold it up; the rest join a later batch "
        "(where trainer.stale_policy applies to them).",
    )
    min_group_size: int | None = Field(
        None,
        ge=1,
        description="Async training: partial groups. When the trainer waits for a batch, "
        "a group with at least this many finished episodes fills it without its "
        "stragglers, which are cancelled on their workers and engines "
        "(`async/aborted_stragglers`). "
        "Null = rollout.n (whole groups only).",
    )
    agent_loop_episodes: bool = Field(
        True,
        description="Async training: run agent loops over `data.train_files` to produce "
        "episodes. False = train only on episodes from the gateway's queue sink (finished "
        "sessions of free-running OpenAI clients, `gateway.sink: queue`); then "
        "`data.train_files` may be empty.",
    )
    samples_to_save: int = Field(
        4, ge=0, description="Trajectories rendered to the run directory each step."
    )
    batch_timeout_s: float = Field(
        3600.0,
        gt=0,
        description="Async training: seconds to wait for one training batch before the run "
        "stops with an error saying what the queue holds and what is running (a batch "
        "that can never form stops the run at once).",
    )
