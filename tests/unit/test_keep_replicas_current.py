"""Trainer.keep_replicas_current over a fake client and weight sync: a replica that came
back with old weights gets the current ones; one that never takes them stops the run."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from agentrl.config import load_config
from agentrl.trainer.trainer import Trainer


class _Client:
    def __init__(self, versions: list[int]) -> None:
        self.versions = versions

    async def stats(self) -> list[dict[str, Any]]:
        return [{"replica_id": f"r{i}", "weight_version": v} for i, v in enumerate(self.versions)]


class _Sync:
    """Pushes reach every replica unless ``lost`` (the replica keeps crashing)."""

    def __init__(self, client: _Client, lost: bool = False) -> None:
        self.client, self.lost, self.pushes = client, lost, []

    async def push_from(self, source: Any, version: int) -> None:
        self.pushes.append(version)
        if not self.lost:
            self.client.versions = [version] * len(self.client.versions)


def _trainer(versions: list[int], version: int, lost: bool = False) -> Trainer:
    trainer = Trainer(load_config(None, []))
    trainer.version, trainer.actor = version, object()
    trainer.client = SimpleNamespace(control=_Client(versions))
    trainer.sync = _Sync(trainer.client.control, lost)
    return trainer


async def test_a_replica_with_old_weights_gets_the_current_version_once():
    trainer = _trainer([3, 0], version=3)
    await trainer.keep_replicas_current()
    await trainer.keep_replicas_current()
    assert trainer.sync.pushes == [3]
    assert trainer.client.control.versions == [3, 3]


async def test_current_replicas_and_the_initial_version_push_nothing():
    current = _trainer([2, 2], version=2)
    await current.keep_replicas_current()
    initial = _trainer([0], version=0)
    await initial.keep_replicas_current()
    assert current.sync.pushes == initial.sync.pushes == []


async def test_a_replica_that_never_takes_the_weights_stops_the_run_with_its_id():
    trainer = _trainer([5, 1], version=5, lost=True)
    for _ in range(3):
        await trainer.keep_replicas_current()
    with pytest.raises(RuntimeError, match=r"replicas \{'r1': 1\} still serve .* after 3 pushes"):
        await trainer.keep_replicas_current()
    assert trainer.sync.pushes == [5, 5, 5]
