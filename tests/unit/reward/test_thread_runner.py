"""ThreadRunner: reward calls on reused threads; a call that times out gives its thread up."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agentrl.reward.runners import ThreadRunner


def _reward_threads() -> int:
    return sum(t.name == "agentrl-reward" and t.is_alive() for t in threading.enumerate())


def _double(x: int) -> int:
    return 2 * x


def _fail(x: int) -> int:
    raise ValueError(f"bad {x}")


async def test_calls_reuse_an_idle_thread_and_errors_do_not_cost_it() -> None:
    runner = ThreadRunner()
    before = _reward_threads()
    assert [await runner.run(_double, {"x": i}, timeout_s=5) for i in range(20)] == [
        2 * i for i in range(20)
    ]
    with pytest.raises(ValueError, match="bad 3"):
        await runner.run(_fail, {"x": 3}, timeout_s=5)
    assert await runner.run(_double, {"x": 4}, timeout_s=5) == 8
    assert _reward_threads() - before == 1


async def test_overlapping_calls_each_get_a_thread() -> None:
    runner = ThreadRunner()
    both_in = threading.Barrier(2, timeout=5)

    def meet(x: int) -> int:
        both_in.wait()  # only returns once the other call runs at the same time
        return x

    assert await asyncio.gather(
        runner.run(meet, {"x": 1}, timeout_s=5), runner.run(meet, {"x": 2}, timeout_s=5)
    ) == [1, 2]


async def test_a_call_that_times_out_leaves_its_thread_and_the_next_runs_at_once() -> None:
    runner = ThreadRunner()
    release = threading.Event()
    stuck_ended = threading.Event()

    def stuck(x: int) -> int:
        release.wait(10)
        stuck_ended.set()
        return x

    with pytest.raises(TimeoutError):
        await runner.run(stuck, {"x": 1}, timeout_s=0.1)
    assert await runner.run(_double, {"x": 5}, timeout_s=1) == 10  # not behind the stuck one
    before = _reward_threads()
    release.set()
    assert stuck_ended.wait(5)
    for _ in range(50):  # the abandoned thread ends once its call returns
        if _reward_threads() < before:
            break
        await asyncio.sleep(0.02)
    assert _reward_threads() == before - 1
