"""AgentLoopManager on real Ray when an agent-loop worker's process is killed by PID: the
episodes it was running run again (or fail, with ``rollout.worker_death_retries=0``),
episodes sent while Ray restarts it wait for it or go to another live worker, and a
worker that does not come back ends in ``NoLiveWorker``. Every episode comes back once.

The workers are stand-ins (episodes that sleep), so no rollout server is needed; the
same kill during a real async training run is in ``test_async_faults.py``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import pytest
import ray

from agentrl.config import load_config
from agentrl.core.config import RayConfig
from agentrl.core.types import SamplingParams
from agentrl.rollout.episode import EpisodeRequest, EpisodeResult, make_requests
from agentrl.rollout.episode_batches import EpisodeStreamer
from agentrl.rollout.manager import AgentLoopManager
from agentrl.rollout.worker_pool import NoLiveWorker
from agentrl.server.launch import init_ray

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

EPISODE_S = 1.5
IN_FLIGHT = 8


class SleepingWorker(EpisodeStreamer):
    """What the manager uses of ``AgentLoopWorker``: an episode sleeps ``EPISODE_S`` and
    comes back as a result named after the worker process that ran it. A restart takes
    ``RESTART_S`` (the real worker loads its tokenizer and connects to the servers); Ray
    fails calls sent to it meanwhile, about a second after each was sent."""

    RESTART_S = 3.0

    def __init__(self, config: dict) -> None:
        self.running = 0
        if ray.get_runtime_context().was_current_actor_reconstructed:
            time.sleep(self.RESTART_S)

    async def ping(self) -> None:
        pass

    async def pid(self) -> int:
        return os.getpid()

    async def in_flight(self) -> int:
        return self.running

    async def run_episode(self, request: EpisodeRequest) -> EpisodeResult:
        self.running += 1
        try:
            await asyncio.sleep(EPISODE_S)
        finally:
            self.running -= 1
        pid = str(os.getpid())
        r = request
        return EpisodeResult(r.episode_id, r.group_id, r.row_index, r.sample_index, pid)


class SlowToRestartWorker(SleepingWorker):
    """Takes a minute to start again after Ray restarts it."""

    RESTART_S = 60.0


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    init_ray(RayConfig(num_cpus=2, log_to_driver=True))
    # The stand-in workers travel to their actors, which cannot import this file.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.shutdown()


def _manager(workers: int, extra: list[str] = (), worker_cls: type = SleepingWorker):
    cfg = load_config(None, [f"rollout.num_workers={workers}", *extra])
    return AgentLoopManager(cfg, worker_cls=worker_cls)


def _requests(count: int) -> list[EpisodeRequest]:
    rows = [{"prompt": [{"role": "user", "content": str(i)}]} for i in range(count)]
    return make_requests(rows, 1, SamplingParams(max_tokens=4))


async def _kill_when_running(manager: AgentLoopManager, index: int) -> int:
    """Kill worker ``index`` by PID once ``IN_FLIGHT`` episodes run on it; returns how
    many ran when it died."""
    worker = manager.workers[index]
    async with asyncio.timeout(60):
        while (running := await worker.in_flight.remote()) < IN_FLIGHT:
            await asyncio.sleep(0.05)
    os.kill(await worker.pid.remote(), signal.SIGKILL)
    return running


async def _produce(manager: AgentLoopManager, total: int) -> list[EpisodeResult]:
    """What the async trainer's producer does: ``IN_FLIGHT`` episodes at a time, the next
    one started as soon as one comes back, failed or not."""
    requests = iter(_requests(total))
    running = {asyncio.create_task(manager.run(next(requests))) for _ in range(IN_FLIGHT)}
    results = []
    while running:
        done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            results.append(task.result())
            if (request := next(requests, None)) is not None:
                running.add(asyncio.create_task(manager.run(request)))
    return results


@pytest.mark.parametrize("retries", [1, 0])
async def test_episodes_sent_while_a_killed_worker_restarts_wait_for_it(retries):
    manager = _manager(1, [f"rollout.worker_death_retries={retries}"])
    try:
        (first_pid,) = {await w.pid.remote() for w in manager.workers}
        produced = asyncio.create_task(_produce(manager, 40))
        in_flight = await _kill_when_running(manager, 0)
        results = await asyncio.wait_for(produced, 120)
    finally:
        manager.shutdown()

    assert in_flight == IN_FLIGHT
    assert len(results) == 40 and len({r.episode_id for r in results}) == 40
    failed = [r for r in results if not r.ok]
    retried = [r for r in results if r.retries]
    if retries:
        # The episodes the dead worker ran came back from the restarted one.
        assert not failed, failed[0].error
        assert len(retried) == in_flight
        assert str(first_pid) not in {r.agent_name for r in retried}
    else:
        # Exactly those failed; none of the episodes sent during the restart did.
        assert len(failed) == in_flight and not retried
        assert all("its agent-loop worker died" in r.error for r in failed)


async def test_episodes_go_to_the_live_worker_while_the_other_restarts():
    manager = _manager(2)
    try:
        pids = [await w.pid.remote() for w in manager.workers]
        first = [asyncio.create_task(manager.run(r)) for r in _requests(2 * IN_FLIGHT)]
        await _kill_when_running(manager, 0)
        # Sent at once after the kill, before Ray restarted worker 0 (some before anyone
        # noticed its death: those fail at once and run again).
        later = await asyncio.wait_for(
            asyncio.gather(*(manager.run(r) for r in _requests(2 * IN_FLIGHT))), 60
        )
        earlier = await asyncio.gather(*first)
    finally:
        manager.shutdown()

    assert all(r.ok for r in [*earlier, *later])
    assert sum(r.retries for r in earlier) == IN_FLIGHT
    # Nothing waited for the restart: the dead worker's episodes and the later ones ran
    # on the live worker.
    assert {r.agent_name for r in later} == {str(pids[1])}
    assert {r.agent_name for r in earlier if r.retries} == {str(pids[1])}


async def test_a_worker_that_does_not_come_back_in_time_ends_in_no_live_worker():
    manager = _manager(1, ["rollout.worker_restart_timeout_s=3"], SlowToRestartWorker)
    try:
        running = [asyncio.create_task(manager.run(r)) for r in _requests(IN_FLIGHT)]
        await _kill_when_running(manager, 0)
        started = time.monotonic()
        with pytest.raises(NoLiveWorker, match="worker 0 was not back 3 s after it died"):
            await asyncio.wait_for(asyncio.gather(*running), 60)
        assert time.monotonic() - started < 10
        with pytest.raises(NoLiveWorker):
            await manager.run(_requests(1)[0])
    finally:
        manager.shutdown()


async def test_a_worker_ray_gave_up_on_ends_in_no_live_worker():
    manager = _manager(1)
    try:
        running = [asyncio.create_task(manager.run(r)) for r in _requests(IN_FLIGHT)]
        await _kill_when_running(manager, 0)  # the first of its restarts
        await asyncio.gather(*running)
        ray.kill(manager.workers[0], no_restart=True)
        with pytest.raises(NoLiveWorker, match="worker 0 died for good"):
            await asyncio.wait_for(manager.run(_requests(1)[0]), 60)
    finally:
        manager.shutdown()
