"""Trainer.keep_replicas_current over a fake client and weight sync: a replica that came
back with old weights gets the current ones; one that never takes them stops the run. And
``Trainer.fit`` owns the rollout client: it closes it however the steps end."""

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
    trainer.version, trainer.processes.actor = version, object()
    trainer.processes.client = SimpleNamespace(control=_Client(versions))
    trainer.processes.sync = _Sync(trainer.processes.client.control, lost)
    return trainer


async def test_a_replica_with_old_weights_gets_the_current_version_once():
    trainer = _trainer([3, 0], version=3)
    await trainer.keep_replicas_current()
    await trainer.keep_replicas_current()
    assert trainer.processes.sync.pushes == [3]
    assert trainer.processes.client.control.versions == [3, 3]


async def test_current_replicas_and_the_initial_version_push_nothing():
    current = _trainer([2, 2], version=2)
    await current.keep_replicas_current()
    initial = _trainer([0], version=0)
    await initial.keep_replicas_current()
    assert current.processes.sync.pushes == initial.processes.sync.pushes == []


async def test_a_replica_that_never_takes_the_weights_stops_the_run_with_its_id():
    trainer = _trainer([5, 1], version=5, lost=True)
    for _ in range(3):
        await trainer.keep_replicas_current()
    with pytest.raises(RuntimeError, match=r"replicas \{'r1': 1\} still serve .* after 3 pushes"):
        await trainer.keep_replicas_current()
    assert trainer.processes.sync.pushes == [5, 5, 5]


class _OwnedClient:
    """Records whether the trainer closed its rollout client (``async with``)."""

    def __init__(self) -> None:
        self.entered = self.closed = False

    async def __aenter__(self) -> _OwnedClient:
        self.entered = True
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.closed = True


@pytest.mark.parametrize("fails", [False, True])
async def test_fit_owns_the_rollout_client_so_the_steps_need_not_close_it(fails, monkeypatch):
    trainer = Trainer(load_config(None, []))
    trainer.processes.client = client = _OwnedClient()
    saved = []

    async def train_steps() -> list[dict[str, float]]:
        assert client.entered and not client.closed  # the steps run inside its lifetime
        if fails:
            raise RuntimeError("a step failed")
        return [{"step": 1.0}]

    monkeypatch.setattr(trainer, "train_steps", train_steps)
    monkeypatch.setattr(trainer, "save_checkpoint", lambda: saved.append(True))
    if fails:
        with pytest.raises(RuntimeError, match="a step failed"):
            await trainer.fit()
    else:
        assert await trainer.fit() == [{"step": 1.0}]
    assert client.closed and saved == ([] if fails else [True])
