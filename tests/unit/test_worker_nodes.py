"""Agent-loop workers are dealt one per node, the driver's node first."""

import pytest

from agentrl.rollout import worker_nodes
from agentrl.rollout.worker_nodes import (
    NODE_ID_LABEL,
    deal,
    node_order,
    on_node_while_alive,
    worker_placement,
)


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


def test_cpu_free_workers_ask_for_their_dealt_node_by_label(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    head, worker = "b" * 56, "a" * 56
    monkeypatch.setattr(worker_nodes.ray, "nodes", lambda: [_node(worker), _node(head)])

    class _Context:
        def get_node_id(self) -> str:
            return head

    monkeypatch.setattr(worker_nodes.ray, "get_runtime_context", _Context)
    placements = worker_placement(3, num_cpus=0.0)
    assert [p["label_selector"] for p in placements] == [
        {NODE_ID_LABEL: head},
        {NODE_ID_LABEL: worker},
        {NODE_ID_LABEL: head},
    ]


def test_a_lost_node_s_worker_falls_back_to_any_other_node() -> None:
    placement = on_node_while_alive("c" * 56)
    assert placement["fallback_strategy"] == [{"label_selector": {NODE_ID_LABEL: "!" + "c" * 56}}]


def test_the_placement_passes_ray_s_own_option_checks() -> None:
    # Ray validates label keys, selector values and fallback entries when options are set.
    import ray

    @ray.remote
    class _Actor:
        pass

    _Actor.options(num_cpus=0, **on_node_while_alive("d" * 56))


def test_workers_that_ask_for_cpus_keep_ray_s_spread() -> None:
    # Pinned to a node whose CPUs are taken, a worker would wait for them indefinitely.
    assert worker_placement(2, num_cpus=1.0) == [{"scheduling_strategy": "SPREAD"}] * 2
