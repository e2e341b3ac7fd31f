"""A training rank's failure names its node when the node died (``WorkerGroupError``)."""

from __future__ import annotations

import ray

from agentrl.trainer import group

NODE = "6a3f1b2c" + "0" * 48


def _nodes(alive: bool) -> list[dict]:
    return [
        {"NodeID": "f" * 56, "Alive": True, "NodeManagerAddress": "10.0.0.1"},
        {"NodeID": NODE, "Alive": alive, "NodeManagerAddress": "10.0.0.2"},
    ]


def test_a_rank_on_a_dead_node_names_the_node(monkeypatch):
    monkeypatch.setattr(ray, "nodes", lambda: _nodes(alive=False))
    assert group._lost_node(NODE, wait_s=0) == " (its node 6a3f1b2c at 10.0.0.2 died)"


def test_a_rank_on_a_live_node_adds_nothing(monkeypatch):
    monkeypatch.setattr(ray, "nodes", lambda: _nodes(alive=True))
    assert group._lost_node(NODE, wait_s=0) == ""


def test_a_node_the_gcs_marks_dead_a_moment_later_is_named(monkeypatch):
    calls = iter([_nodes(alive=True), _nodes(alive=True), _nodes(alive=False)])
    monkeypatch.setattr(ray, "nodes", lambda: next(calls))
    monkeypatch.setattr(group.time, "sleep", lambda _: None)
    assert "died" in group._lost_node(NODE, wait_s=60)
