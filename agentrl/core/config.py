"""The config base every section derives from, and the sections several layers share.

Each subsystem owns its own section next to its code (``agentrl.server.config``,
``agentrl.agent_loops.config``, ``agentrl.trainer.config``, ``agentrl.algos.config``, ...);
only :mod:`agentrl.config` composes them into the full ``AgentRLConfig`` tree.
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
