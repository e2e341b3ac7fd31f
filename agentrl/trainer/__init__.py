"""Training workers: FSDP2 actor, reference and critic ranks as Ray actor groups."""

from agentrl.trainer.config import (
    ActorConfig,
    CriticConfig,
    FSDPConfig,
    LoRAConfig,
    OptimConfig,
    ReferenceConfig,
    WorkersConfig,
)
from agentrl.trainer.dispatch import Batch
from agentrl.trainer.group import (
    ActorGroup,
    CriticGroup,
    ReferenceGroup,
    WorkerGroup,
    WorkerGroupError,
)
from agentrl.trainer.micro_batch import MicroBatch, PolicyLossFn, ValueLossFn

__all__ = [
    "ActorConfig",
    "ActorGroup",
    "Batch",
    "CriticConfig",
    "CriticGroup",
    "FSDPConfig",
    "LoRAConfig",
    "MicroBatch",
    "OptimConfig",
    "PolicyLossFn",
    "ReferenceConfig",
    "ReferenceGroup",
    "ValueLossFn",
    "WorkerGroup",
    "WorkerGroupError",
    "WorkersConfig",
]
