"""The staleness rule: capacity formula and the bound under random timings."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.rollout.staleness import StalenessController


def test_capacity_follows_the_formula():
    c = StalenessController(max_staleness=1, batch_size=4, max_concurrency=100)
    assert c.capacity == 8  # (1 + 0 + 1) * 4
    c.start(5)
    assert c.capacity == 3
    c.finish()
    c.finish(kept=False)
    assert (c.accepted, c.running, c.rejected) == (1, 3, 1)
    assert c.capacity == 4  # 8 - (1 + 3): a rejected episode frees its slot
    c.set_version(1)
    assert c.capacity == 8


def test_concurrency_cap_wins_when_smaller():
    c = StalenessController(max_staleness=3, batch_size=10, max_concurrency=6)
    assert c.capacity == 6
    c.start(6)
    assert c.capacity == 0


def test_eta_zero_allows_exactly_one_batch_per_version():
    c = StalenessController(max_staleness=0, batch_size=3, max_concurrency=100)
    c.start(3)
    assert c.capacity == 0
    for _ in range(3):
        c.finish()
    assert c.capacity == 0
    c.set_version(1)
    assert c.capacity == 3


def test_starting_beyond_capacity_is_refused():
    c = StalenessController(max_staleness=0, batch_size=2, max_concurrency=10)
    with pytest.raises(RuntimeError, match="exceeds capacity"):
        c.start(3)


def test_invalid_settings_and_version_regressions_are_refused():
    with pytest.raises(ValueError):
        StalenessController(max_staleness=-1, batch_size=2, max_concurrency=2)
    c = StalenessController(max_staleness=1, batch_size=2, max_concurrency=2)
    c.set_version(2)
    with pytest.raises(ValueError, match="went back"):
        c.set_version(1)


def _simulate(eta, batch, cap, seed, in_order):
    """A producer and a trainer with random interleavings; returns (steps, dropped).

    Episodes record the version at which they started. The trainer consumes B accepted
    episodes per step (oldest first) and drops any that started more than eta versions ago.
    """
    rng = random.Random(seed)
    c = StalenessController(max_staleness=eta, batch_size=batch, max_concurrency=cap)
    running: list[int] = []
    finished: list[int] = []
    steps = dropped = 0
    for _ in range(600):
        action = rng.random()
        if action < 0.4 and c.capacity > 0:
            n = rng.randint(1, c.capacity)
            c.start(n)
            running += [c.version] * n
        elif action < 0.8 and running:
            started = running.pop(0 if in_order else rng.randrange(len(running)))
            keep = rng.random() > 0.1
            c.finish(kept=keep)
            if keep:
                finished.append(started)
        elif len(finished) >= batch:
            fresh = [v for v in finished if v >= c.version - eta]
            for _ in range(len(finished) - len(fresh)):
                c.discard_accepted()
            dropped += len(finished) - len(fresh)
            finished = fresh
            if len(finished) >= batch:
                trained, finished = finished[:batch], finished[batch:]
                assert min(trained) >= c.version - eta
                steps += 1
                c.set_version(c.version + 1)
        assert 0 <= c.running <= cap
        assert c.accepted + c.running <= (eta + c.version + 1) * batch
        # Never deadlocked: something can always still happen.
        assert c.capacity > 0 or running or len(finished) >= batch or finished
    return steps, dropped


@settings(max_examples=200, deadline=None)
@given(
    eta=st.integers(0, 3),
    batch=st.integers(1, 6),
    cap=st.integers(1, 20),
    seed=st.integers(0, 10_000),
)
def test_bound_holds_and_nothing_stale_is_trained_under_random_timings(eta, batch, cap, seed):
    steps, _ = _simulate(eta, batch, cap, seed, in_order=False)
    assert steps > 0


@settings(max_examples=200, deadline=None)
@given(
    eta=st.integers(0, 3),
    batch=st.integers(1, 6),
    cap=st.integers(1, 20),
    seed=st.integers(0, 10_000),
)
def test_rule_alone_keeps_staleness_when_episodes_finish_in_order(eta, batch, cap, seed):
    _, dropped = _simulate(eta, batch, cap, seed, in_order=True)
    assert dropped == 0


def test_a_step_without_a_new_version_frees_a_batch_and_a_resume_starts_afresh():
    c = StalenessController(max_staleness=0, batch_size=2, max_concurrency=10, version=7)
    assert c.capacity == 2  # the budget counts steps of this run, not the version
    c.start(2)
    c.finish()
    c.finish()
    c.finish_step(7)  # the step made no update
    assert (c.version, c.steps, c.capacity) == (7, 1, 2)
    c.finish_step(8)
    assert (c.version, c.steps, c.capacity) == (8, 2, 4)
