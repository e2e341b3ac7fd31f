"""The worker pool: round-robin over live workers, waiting out a restart."""

import asyncio
import logging

import pytest
import ray

from agentrl.rollout import worker_pool
from agentrl.rollout.worker_pool import NoLiveWorker, WorkerPool


class _Ping:
    def __init__(self, actor: "_Actor") -> None:
        self.actor = actor

    def remote(self):
        return self.actor.answer()


class _Actor:
    """Stands in for an actor handle: ``ping.remote()`` is awaitable and fails while
    ``restarting``, as Ray's does while it restarts the actor."""

    def __init__(self) -> None:
        self.restarting = False
        self.dead = False
        self.ping = _Ping(self)

    async def answer(self) -> None:
        if self.dead:
            raise ray.exceptions.ActorDiedError()
        if self.restarting:
            raise ray.exceptions.ActorUnavailableError("restarting", None)


@pytest.fixture(autouse=True)
def _fast_pings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_pool, "_PING_RETRY_S", 0.01)


async def test_live_workers_are_handed_out_in_turn() -> None:
    pool = WorkerPool([_Actor(), _Actor()], restart_timeout_s=5)
    assert [(await pool.acquire())[0] for _ in range(4)] == [0, 1, 0, 1]


async def test_a_groups_episodes_share_a_worker_up_to_what_it_runs_at_once() -> None:
    actors = [_Actor(), _Actor(), _Actor()]
    pool = WorkerPool(actors, restart_timeout_s=5, max_run=3)
    keys = ["a", "a", "a", "b", "b", "c", None, None]
    assert [(await pool.acquire(k))[0] for k in keys] == [0, 0, 0, 1, 1, 2, 0, 1]
    assert [(await pool.acquire("big"))[0] for _ in range(7)] == [2, 2, 2, 0, 0, 0, 1]
    assert (await pool.acquire("d"))[0] == 2
    actors[2].restarting = True
    pool.died(2)
    assert (await pool.acquire("d"))[0] != 2  # its worker is restarting: another one


async def test_a_restarting_worker_is_skipped_until_it_answers_again() -> None:
    actors = [_Actor(), _Actor()]
    pool = WorkerPool(actors, restart_timeout_s=5)
    actors[0].restarting = True
    pool.died(0)
    assert {(await pool.acquire())[0] for _ in range(3)} == {1}
    actors[0].restarting = False
    await asyncio.sleep(0.1)
    assert {(await pool.acquire())[0] for _ in range(4)} == {0, 1}


async def test_a_worker_that_died_for_good_is_lost_and_the_last_one_raises() -> None:
    actor = _Actor()
    pool = WorkerPool([actor], restart_timeout_s=5)
    actor.dead = True
    pool.died(0)
    with pytest.raises(NoLiveWorker, match="worker 0 died for good"):
        await pool.acquire()


async def test_closing_stops_the_wait_so_a_later_kill_is_not_reported_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    actor = _Actor()
    pool = WorkerPool([actor], restart_timeout_s=5)
    actor.restarting = True
    pool.died(0)
    await asyncio.sleep(0.05)
    pool.close()
    actor.dead = True  # the shutdown's ray.kill
    await asyncio.sleep(0.1)
    assert pool.lost == {}
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]
