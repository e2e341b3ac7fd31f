"""Training workers: FSDP2 actor, reference and critic ranks as Ray actor groups.

The names below load lazily, on first use: importing ``agentrl.trainer.config`` (pure
pydantic, mounted by the config tree) must not load the FSDP workers and torch.distributed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_EXPORTS = {
    "ActorConfig": "agentrl.trainer.config",
    "CriticConfig": "agentrl.trainer.config",
    "FSDPConfig": "agentrl.trainer.config",
    "LoRAConfig": "agentrl.trainer.config",
    "OptimConfig": "agentrl.trainer.config",
    "ReferenceConfig": "agentrl.trainer.config",
    "WorkersConfig": "agentrl.trainer.config",
    "Batch": "agentrl.trainer.dispatch",
    "ActorGroup": "agentrl.trainer.group",
    "CriticGroup": "agentrl.trainer.group",
    "ReferenceGroup": "agentrl.trainer.group",
    "WorkerGroup": "agentrl.trainer.group",
    "WorkerGroupError": "agentrl.trainer.group",
    "MicroBatch": "agentrl.trainer.micro_batch",
    "PolicyLossFn": "agentrl.trainer.micro_batch",
    "ValueLossFn": "agentrl.trainer.micro_batch",
}

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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentrl.trainer' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
