"""Replica choices of the session-affinity policy."""

from __future__ import annotations

import pytest

from agentrl.server.affinity import SessionAffinityPolicy, affinity_stats, register_policy

REPLICAS = ["r0", "r1"]


def _route(policy: SessionAffinityPolicy, session: str | None, request: str) -> str:
    replica = policy.choose(session, REPLICAS)
    policy.on_routed(request, replica)
    return replica


def test_first_request_of_session_goes_to_least_loaded_replica():
    policy = SessionAffinityPolicy()
    policy.on_routed("busy-1", "r0")
    policy.on_routed("busy-2", "r0")
    assert policy.choose("new-session", REPLICAS) == "r1"


def test_later_requests_stick_to_the_sessions_replica():
    policy = SessionAffinityPolicy()
    first = _route(policy, "s", "t1")
    policy.on_completed("t1")
    # Make the sticky replica slightly busier: affinity must still win.
    policy.on_routed("other", first)
    assert policy.choose("s", REPLICAS) == first
    assert policy.stats.sticky_hits == 1


def test_new_sessions_spread_evenly_across_replicas():
    policy = SessionAffinityPolicy()
    placed = [policy.choose(f"s{i}", REPLICAS) for i in range(10)]
    assert placed.count("r0") == placed.count("r1") == 5


def test_sticky_session_stays_however_busy_its_replica_is_next_to_an_idle_one():
    policy = SessionAffinityPolicy()
    home = _route(policy, "s", "t1")
    for i in range(50):
        policy.on_routed(f"x{i}", home)
    assert policy.choose("s", REPLICAS) == home
    assert policy.stats.moves == 0


def test_session_moves_once_when_its_replica_is_full_and_stays_where_it_went():
    policy = SessionAffinityPolicy()
    home = _route(policy, "s", "t1")
    other = next(r for r in REPLICAS if r != home)
    assert policy.choose("s", REPLICAS, full={home}) == other
    # The old replica has room again: the session stays with its new cache.
    assert [policy.choose("s", REPLICAS) for _ in range(3)] == [other] * 3
    assert (policy.stats.moves, policy.stats.sticky_hits) == (1, 3)


def test_full_replicas_take_no_new_sessions_unless_all_are_full():
    policy = SessionAffinityPolicy()
    assert {policy.choose(f"s{i}", REPLICAS, full={"r0"}) for i in range(4)} == {"r1"}
    assert policy.choose("t", REPLICAS, full=set(REPLICAS)) == "r0"
    assert policy.choose("s0", REPLICAS, full=set(REPLICAS)) == "r1"  # nowhere better
    assert policy.stats.moves == 0


def test_a_restarted_replica_gets_new_sessions_and_takes_none_of_the_running_ones():
    policy = SessionAffinityPolicy()
    home = {f"s{i}": _route(policy, f"s{i}", f"a{i}") for i in range(8)}
    survivor = "r1"
    policy.remove_replica("r0")  # killed; Serve restarts it under a new id
    live = [survivor]
    for i, session in enumerate(home):
        assert policy.choose(session, live, avoid={"r0"}) == survivor
        policy.on_routed(f"b{i}", survivor)
    assert policy.stats.failovers == 4
    restarted = [survivor, "r2"]
    for _ in range(5):
        for session in home:
            assert policy.choose(session, restarted) == survivor
    new = []
    for i in range(8):
        new.append(policy.choose(f"n{i}", restarted))
        policy.on_routed(f"n{i}", new[-1])
    assert new == ["r2"] * 8  # the idle replica takes the new sessions until loads even out
    assert (policy.stats.failovers, policy.stats.moves) == (4, 0)


def test_session_fails_over_when_its_replica_disappears():
    policy = SessionAffinityPolicy()
    home = _route(policy, "s", "t1")
    other = next(r for r in REPLICAS if r != home)
    policy.remove_replica(home)
    assert policy.in_flight(home) == 0
    assert policy.choose("s", [other]) == other
    assert policy.stats.failovers == 1


def test_lru_bound_evicts_least_recently_used_session():
    policy = SessionAffinityPolicy(max_sessions=2)
    policy.choose("a", REPLICAS)
    policy.choose("b", REPLICAS)
    policy.choose("a", REPLICAS)  # refresh a; b is now the oldest
    policy.choose("c", REPLICAS)
    assert policy.num_sessions == 2
    assert policy.replica_of("b") is None
    assert policy.replica_of("a") is not None and policy.replica_of("c") is not None
    assert policy.stats.evictions == 1


def test_in_flight_count_decrements_on_completion_exactly_once():
    policy = SessionAffinityPolicy()
    replica = _route(policy, "s", "t1")
    _route(policy, "s", "t2")
    assert policy.in_flight(replica) == 2
    policy.on_completed("t1")
    policy.on_completed("t1")  # duplicate completion callbacks must not go negative
    assert policy.in_flight(replica) == 1
    policy.on_completed("t2")
    assert policy.in_flight(replica) == 0


def test_rerouting_a_request_moves_its_in_flight_count():
    policy = SessionAffinityPolicy()
    policy.on_routed("t1", "r0")
    policy.on_routed("t1", "r1")
    assert (policy.in_flight("r0"), policy.in_flight("r1")) == (0, 1)


def test_sessionless_requests_go_to_least_loaded():
    policy = SessionAffinityPolicy()
    policy.on_routed("busy", "r1")
    assert policy.choose(None, REPLICAS) == "r0"
    assert policy.num_sessions == 0


def test_no_candidates_is_a_clear_error():
    with pytest.raises(ValueError, match="no replica"):
        SessionAffinityPolicy().choose("s", [])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_sessions": 0}, "max_sessions"),
    ],
)
def test_invalid_settings_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SessionAffinityPolicy(**kwargs)


def test_stats_snapshot_is_a_copy():
    policy = SessionAffinityPolicy()
    register_policy("test-deployment", policy)
    policy.choose("s", REPLICAS)
    snapshot = affinity_stats()["test-deployment"]
    policy.choose("t", REPLICAS)
    assert snapshot.new_sessions == 1
    assert affinity_stats()["test-deployment"].new_sessions == 2


def test_replica_that_failed_the_request_is_avoided_and_counted_as_failover():
    policy = SessionAffinityPolicy()
    home = _route(policy, "s", "t1")
    other = next(r for r in REPLICAS if r != home)
    assert policy.choose("s", REPLICAS, avoid={home}) == other
    assert policy.stats.failovers == 1
    assert policy.replica_of("s") == other


def test_avoid_is_ignored_when_no_other_replica_is_left():
    policy = SessionAffinityPolicy()
    assert policy.choose("s", ["r0"], avoid={"r0"}) == "r0"


def test_stats_of_several_routers_of_one_deployment_add_up():
    first, second = SessionAffinityPolicy(), SessionAffinityPolicy()
    register_policy("two-routers", first)
    register_policy("two-routers", second)
    first.choose("s", REPLICAS)
    second.choose("t", REPLICAS)
    second.choose("t", REPLICAS)
    stats = affinity_stats()["two-routers"]
    assert (stats.new_sessions, stats.sticky_hits) == (2, 1)


def test_pinned_sessions_follow_their_groups_replica_and_count_as_choose_would():
    policy = SessionAffinityPolicy()
    policy.pin(["a", "b"], "r0", REPLICAS)  # a coalesced call of two new sessions
    assert (policy.replica_of("a"), policy.replica_of("b")) == ("r0", "r0")
    assert policy.choose("a", REPLICAS) == "r0"  # the next turn sticks
    policy.pin(["a"], "r0", REPLICAS)
    policy.pin(["b"], "r1", REPLICAS)  # its group moved (r0 was full)
    policy.pin(["a"], "r1", ["r1"])  # its group failed over (r0 is gone)
    assert (policy.replica_of("a"), policy.replica_of("b")) == ("r1", "r1")
    stats = policy.stats
    assert (stats.new_sessions, stats.sticky_hits, stats.moves, stats.failovers) == (2, 2, 1, 1)
    # Pinned sessions count toward placement: new ones go to the replica with fewer.
    assert policy.choose("c", REPLICAS) == "r0"
