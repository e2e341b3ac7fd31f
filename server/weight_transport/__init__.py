"""Weight transports: how a trainer's new weights reach the rollout replicas.

One module per transport, each holding its sender (trainer), its receiver (replica) and,
where it delivers into vLLM's worker processes, its worker half (see ``base.py``):
``object_store.py`` and ``broadcast.py``. ``WEIGHT_TRANSPORTS``
(``agentrl/core/config.py``) maps each ``weight_sync.kind`` to its module; a new transport
is a module here and a line there.

This module stays light (no torch, no Ray): the vLLM workers import it to find the worker
half of a transport, and load only that transport's module.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

from agentrl.core.config import WEIGHT_TRANSPORTS, WeightSyncConfig
from agentrl.core.types import RolloutError

if TYPE_CHECKING:
    from agentrl.server.client import ControlClient
    from agentrl.server.weight_transport.base import WeightReceiver, WeightSync


def transport_module(name: str) -> ModuleType:
    """The module of this package that holds transport ``name`` (e.g. ``broadcast``)."""
    if name not in WEIGHT_TRANSPORTS.values():
        raise ValueError(
            f"unknown weight transport {name!r}; known: {sorted(set(WEIGHT_TRANSPORTS.values()))}"
        )
    return importlib.import_module(f"{__name__}.{name}")


def make_weight_sync(config: WeightSyncConfig, control: ControlClient) -> WeightSync:
    """The sender of the transport ``weight_sync.kind`` names, pushing through ``control``
    (the replicas' control calls)."""
    name = WEIGHT_TRANSPORTS.get(config.kind)
    if name is None:
        raise ValueError(
            f"unknown weight sync {config.kind!r}; use one of {', '.join(WEIGHT_TRANSPORTS)}"
        )
    return transport_module(name).make_sender(config, control)


def receiver_class(kind: str) -> type[WeightReceiver]:
    """The receiver registered for ``kind``: a built-in transport's (its module is loaded
    on first use) or a plugin's (``register_receiver``); ``RolloutError`` for another."""
    from agentrl.server.weight_transport.base import RECEIVERS

    if kind not in RECEIVERS and kind in WEIGHT_TRANSPORTS.values():
        transport_module(kind)
    try:
        return RECEIVERS[kind]
    except KeyError:
        raise RolloutError(
            f"unknown weight receiver {kind!r}; known: {', '.join(sorted(RECEIVERS))}"
        ) from None
