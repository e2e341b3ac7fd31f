"""Agent-loop workers are dealt one per node, the driver's node first."""

import pytest
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from agentrl.rollout import worker_nodes
from agentrl.rollout.worker_nodes import deal, node_order, worker_scheduling


def _node(node_id: str, cpus: float = 2.0, alive: bool = True) -> dict:
    return {"NodeID": node_id, "Alive": alive, "Resources": {"CPU": cpus} if cpus else {}}


def test_the_driver_node_comes_first_then_the_others_by_id() -> None:
    nodes = [_node("c"), _node("a"), _node("d"), _node("b")]
    assert node_order(nodes, driver_node="d") == ["d", "a", "b", "c"]


def test_a_driver_outside_the_cluster_s_cpu_nodes_changes_nothing() -> None:
    assert node_order([_node("b"), _node("a")], driver_node="x") == ["a", "b"]


def test_dead_nodes_and_nodes_without_cpus_get_no_worker() -> None:
    nodes = [_node("head", cpus=0), _node("w1"), _node("w2", alive=False), _node("w3")]
    assert node_order(nodes, driver_node="head") == ["w1", "w3"]


def test_nodes_without_cpus_are_used_when_no_node_has_any() -> None:
    nodes = [_node("b", cpus=0), _node("a", cpus=0)]
    assert node_order(nodes, driver_node="b") == ["b", "a"]


def test_workers_go_round_robin_so_every_node_has_one_before_any_has_two() -> None:
    assert deal(["head", "w1"], 2) == ["head", "w1"]
    assert deal(["head", "w1"], 5) == ["head", "w1", "head", "w1", "head"]
    assert deal(["head", "w1", "w2"], 1) == ["head"]


def test_no_alive_node_is_an_error_not_an_empty_worker_list() -> None:
    with pytest.raises(ValueError, match="no alive Ray node"):
        deal([], 2)


def test_cpu_free_workers_are_pinned_softly_so_a_lost_node_s_worker_restarts_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    head, worker = "b" * 56, "a" * 56  # Ray checks node ids are hex of the right length
    monkeypatch.setattr(worker_nodes.ray, "nodes", lambda: [_node(worker), _node(head)])

    class _Context:
        def get_node_id(self) -> str:
            return head

    monkeypatch.setattr(worker_nodes.ray, "get_runtime_context", _Context)
    strategies = worker_scheduling(3, num_cpus=0.0)
    assert all(isinstance(s, NodeAffinitySchedulingStrategy) and s.soft for s in strategies)
    assert [s.node_id for s in strategies] == [head, worker, head]


def test_workers_that_ask_for_cpus_keep_ray_s_spread() -> None:
    # Pinned to a node whose CPUs are taken, a worker would wait for them indefinitely.
    assert worker_scheduling(2, num_cpus=1.0) == ["SPREAD", "SPREAD"]
