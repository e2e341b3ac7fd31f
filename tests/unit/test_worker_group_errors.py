"""A training group's failure names the ranks that no longer answer and their nodes
(``WorkerGroupError``; the real node loss is ``tests/integration/test_node_loss.py``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import ray

from agentrl.trainer.group import WorkerGroup

LIVE, LOST = "a" * 56, "6a3f1b2c" + "0" * 48


class _Rank:
    """A rank actor whose ping answers (``alive``) or never does."""

    def __init__(self, alive: bool) -> None:
        self.alive = alive
        self.__ray_call__ = SimpleNamespace(remote=lambda _fn: self)


@pytest.fixture
def fake_ray(monkeypatch):
    def wait(refs, num_returns, timeout):
        ready = [r for r in refs if r.alive]
        return ready, [r for r in refs if not r.alive]

    monkeypatch.setattr(ray, "wait", wait)
    monkeypatch.setattr(ray, "get", lambda ref: LIVE)
    monkeypatch.setattr(ray, "nodes", lambda: [{"NodeID": LOST, "Alive": False}])


def _group(*alive: bool) -> WorkerGroup:
    group = object.__new__(WorkerGroup)
    group.actors = [_Rank(a) for a in alive]
    group.rank_nodes = [LIVE if a else LOST for a in alive]
    return group


def test_a_rank_on_a_lost_node_is_named_with_its_node(fake_ray):
    assert _group(True, False)._unreachable_ranks() == (
        " (rank 1 on node 6a3f1b2c (the cluster lists it dead): unreachable, its process "
        "or node lost)"
    )


def test_when_every_rank_answers_nothing_is_added(fake_ray):
    assert _group(True, True)._unreachable_ranks() == ""
