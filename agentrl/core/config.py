"""The config base every section derives from, and the sections several layers share.

Each subsystem owns its own section next to its code (``agentrl.server.config``,
``agentrl.agent_loops.config``, ``agentrl.trainer.config``, ``agentrl.algos.config``, ...);
only :mod:`agentrl.config` composes them into the full ``AgentRLConfig`` tree. The
sections here are read by several layers (``model``, ``ray``) or are the contract between
two of them (``weight_sync``: the trainer's sender and the replicas' receiver).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Section(BaseModel):
    """Base for config sections: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Section):
    path: str = Field("", description="Hugging Face model id or local checkpoint directory.")
    tokenizer_path: str | None = Field(
        None, description="Tokenizer id or directory; defaults to `path`."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Weights dtype for rollout and training (fp32 on CPU)."
    )
    trust_remote_code: bool = Field(False, description="Allow custom model code from the hub.")

    @property
    def tokenizer(self) -> str:
        """The tokenizer location (``tokenizer_path`` or ``path``)."""
        return self.tokenizer_path or self.path


class RayConfig(Section):
    address: str | None = Field(
        None, description="Existing Ray cluster address; None starts a local one."
    )
    num_cpus: int | None = Field(None, description="CPUs Ray may use on a local start.")
    namespace: str = Field("agentrl", description="Ray namespace.")
    log_to_driver: bool = Field(
        False,
        description="Echo every Ray worker's output (Serve replicas and their vLLM "
        "engines, FSDP ranks, agent-loop workers) on the driver's console. Off, the "
        "console shows agentrl's own progress and messages; the workers' logs stay in "
        "Ray's session directory (/tmp/ray/session_latest/logs on a local start), and a "
        "worker's error still reaches the driver as an exception. `agentrl -v` turns it on.",
    )


WEIGHT_TRANSPORTS: dict[str, str] = {
    "object_store": "object_store",
    "nccl": "broadcast",
    "gloo": "broadcast",
}
"""The weight transports by ``weight_sync.kind``: the module of
``agentrl.server.weight_transport`` holding each one's sender, receiver and vLLM-worker
half. A new transport is its module there and one line here."""


class WeightSyncConfig(Section):
    """How the trainer's new weights reach the rollout replicas (``weight_sync.kind``
    names a transport of ``agentrl.server.weight_transport``).

    ``kind`` picks the sender in the trainer and the receiver of the same transport in
    every replica (``WEIGHT_TRANSPORTS``).
    """

    kind: Literal[*WEIGHT_TRANSPORTS] = Field(  # type: ignore[valid-type]
        "object_store",
        description="How new weights reach the rollout replicas. object_store: through the "
        "Ray object store (CPU or GPU). nccl: broadcast from the actor's rank 0 to every vLLM "
        "worker of every replica over a NCCL group of their own (GPU clusters). gloo: the "
        "same broadcast over gloo (CPU). nccl/gloo need server.engine.backend=vllm.",
    )
    pause_mode: Literal["keep", "abort", "wait"] = Field(
        "keep",
        description="How in-flight generation is paused during a weight push "
        "(keep: held and resumed under the new weights).",
    )
    bucket_mb: float = Field(
        256.0,
        gt=0,
        description="Bucket size of a weight push (object store or broadcast), and of the "
        "chunks in which the actor's rank 0 hands the gathered weights over; a decoder layer "
        "is never split.",
    )
    join_timeout_s: float = Field(
        60.0,
        gt=0,
        description="nccl/gloo: seconds every rollout worker has to join the broadcast group "
        "(formed at the first push, again when replicas change) before the push fails.",
    )
    timeout_s: float = Field(
        600.0,
        gt=0,
        description="nccl/gloo: limit of one bucket broadcast, which also waits for every "
        "replica to pause (pause_mode=wait waits for running requests).",
    )
    push_attempts: int = Field(
        3,
        ge=1,
        description="nccl/gloo: a push that fails (a replica died during it, which breaks the "
        "broadcast for every member) is tried again with a group of the replicas that answer "
        "then, up to this many attempts in all. object_store leaves a dead replica out.",
    )


LEGACY_WEIGHT_SYNC_KEYS = {
    "weight_sync": "kind",
    "weight_sync_pause_mode": "pause_mode",
    "weight_sync_bucket_mb": "bucket_mb",
    "weight_sync_join_timeout_s": "join_timeout_s",
    "weight_sync_timeout_s": "timeout_s",
}
"""``trainer.<old key>`` → ``weight_sync.<key>``: where the section's keys used to live."""
