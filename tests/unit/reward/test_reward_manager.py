"""RewardManager: concurrent scoring off the event loop; errors and timeouts give 0."""

from __future__ import annotations

import asyncio
import textwrap
import threading
import time

import pytest

from agentrl.data import DatasetRow
from agentrl.reward import RewardConfig, RewardManager, RewardRequest
from agentrl.reward import runners as runners_module
from agentrl.reward.loader import RewardFnRef


def _requests(n: int, data_source: str = "toy") -> list[RewardRequest]:
    return [RewardRequest(data_source, f"\\boxed{{{i}}}", str(i), {"i": i}) for i in range(n)]


async def test_builtin_math_scoring_of_a_batch():
    manager = RewardManager()
    requests = [
        RewardRequest("gsm8k", "so \\boxed{72}", "72"),
        RewardRequest("gsm8k", "I think 5", "6"),
        RewardRequest("gsm8k", "#### 1,000", 1000),
    ]
    batch = await manager.score_batch(requests)
    assert batch.scores == [1.0, 0.0, 1.0]
    assert batch.results[1].info == {"acc": 0.0, "pred": "5"}
    assert batch.metrics["reward/score/mean"] == pytest.approx(2 / 3)
    assert batch.metrics["reward/acc/mean"] == pytest.approx(2 / 3)
    # Standard error of the mean: sample std (ddof=1) / sqrt(n) = sqrt((1/3) / 3).
    assert batch.metrics["reward/acc/se"] == pytest.approx(1 / 3)
    assert batch.metrics["reward/errors"] == 0 and batch.metrics["reward/timeouts"] == 0


async def test_calls_run_concurrently_up_to_num_workers_and_keep_order():
    running, peak, lock = 0, 0, threading.Lock()

    def slow(data_source, solution_str, ground_truth, extra_info):
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.2)
        with lock:
            running -= 1
        return float(extra_info["i"])

    manager = RewardManager(slow, num_workers=4, timeout_s=5)
    start = time.perf_counter()
    batch = await manager.score_batch(_requests(8))
    elapsed = time.perf_counter() - start
    assert batch.scores == [float(i) for i in range(8)]
    assert peak == 4
    assert elapsed < 1.5  # 2 waves of 0.2 s; serially it would take 8 x 0.2 s


async def test_the_event_loop_stays_responsive_while_scoring():
    def blocking(data_source, solution_str, ground_truth, extra_info):
        time.sleep(0.3)
        return 1.0

    manager = RewardManager(blocking, num_workers=2)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    await manager.score_batch(_requests(2))
    task.cancel()
    assert ticks >= 10


async def test_raising_and_bad_results_score_zero_and_count_as_errors():
    def flaky(data_source, solution_str, ground_truth, extra_info):
        i = extra_info["i"]
        if i == 0:
            raise ValueError("boom")
        if i == 1:
            return "not a number"
        if i == 2:
            return float("nan")
        if i == 3:
            return {"acc": 1.0}
        return {"score": 1.0, "acc": 1.0}

    batch = await RewardManager(flaky).score_batch(_requests(6))
    assert batch.scores == [0.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    assert batch.results[0].error == "ValueError: boom"
    assert "expected a finite float" in batch.results[1].error
    assert "needs a finite 'score'" in batch.results[3].error
    assert batch.metrics["reward/errors"] == 4
    assert batch.metrics["reward/timeouts"] == 0


async def test_system_exit_in_a_reward_function_does_not_escape():
    def exits(data_source, solution_str, ground_truth, extra_info):
        raise SystemExit(3)

    batch = await RewardManager(exits).score_batch(_requests(2))
    assert batch.scores == [0.0, 0.0]
    assert batch.metrics["reward/errors"] == 2


async def test_timeouts_score_zero_are_counted_and_free_the_worker_slot():
    def sometimes_hangs(data_source, solution_str, ground_truth, extra_info):
        if extra_info["i"] % 2 == 0:
            time.sleep(2.0)
        return 1.0

    manager = RewardManager(sometimes_hangs, num_workers=2, timeout_s=0.2)
    start = time.perf_counter()
    batch = await manager.score_batch(_requests(6))
    assert time.perf_counter() - start < 2.5  # hung calls holding slots would take 6 s
    assert batch.scores == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert batch.metrics["reward/timeouts"] == 3
    assert batch.metrics["reward/errors"] == 0
    assert all(r.timed_out for r in batch.results[::2])


async def test_async_reward_functions_are_awaited():
    async def judge(data_source, solution_str, ground_truth, extra_info):
        await asyncio.sleep(0.01)
        return {"score": 0.5, "judge_calls": 1}

    batch = await RewardManager(judge).score_batch(_requests(3))
    assert batch.scores == [0.5, 0.5, 0.5]
    assert batch.metrics["reward/judge_calls/mean"] == 1.0


def test_request_from_a_row_or_its_dict():
    row = DatasetRow(
        prompt="q", data_source="gsm8k", reward_model={"ground_truth": "4"}, extra_info={"k": 1}
    )
    from_row = RewardRequest.from_row(row, "4")
    assert from_row == RewardRequest("gsm8k", "4", "4", {"k": 1})
    assert RewardRequest.from_row(row.to_dict(), "4") == from_row
    with_episode = RewardRequest.from_row(row, "4", {"num_turns": 3, "k": 2})
    assert with_episode.extra_info == {"k": 2, "num_turns": 3}
    assert row.extra_info == {"k": 1}  # the row is not changed


def test_bad_worker_settings_are_rejected():
    with pytest.raises(ValueError, match="num_workers >= 1"):
        RewardManager(num_workers=0)


REWARD_FILE = textwrap.dedent(
    """
    import signal
    import time

    def compute_score(data_source, solution_str, ground_truth, extra_info):
        mode = extra_info.get("mode")
        if mode == "raise":
            raise RuntimeError("bad input")
        if mode == "spin":
            while True:
                pass
        if mode == "stuck":  # like C code that never returns to the interpreter
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(30)
        return {"score": float(solution_str == ground_truth), "pid_is_int": 1}
    """
)


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "proc_reward.py"
    path.write_text(REWARD_FILE)
    return path


async def test_process_executor_scores_counts_errors_and_interrupts_spinning_calls(
    reward_file,
):
    config = RewardConfig(
        reward_fn_path=str(reward_file), executor="process", num_workers=2, timeout_s=0.5
    )
    manager = RewardManager.from_config(config)
    try:
        requests = [
            RewardRequest("toy", "a", "a", {}),
            RewardRequest("toy", "a", "b", {}),
            RewardRequest("toy", "a", "a", {"mode": "raise"}),
            RewardRequest("toy", "a", "a", {"mode": "spin"}),
        ]
        batch = await manager.score_batch(requests)
        assert batch.scores == [1.0, 0.0, 0.0, 0.0]
        assert batch.results[2].error == "RuntimeError: bad input"
        assert batch.results[3].timed_out
        assert batch.metrics["reward/errors"] == 1
        assert batch.metrics["reward/timeouts"] == 1
        assert batch.metrics["reward/pid_is_int/mean"] == 1.0
    finally:
        manager.close()


async def test_process_call_stuck_past_its_alarm_is_cut_off_and_the_pool_replaced(
    reward_file, monkeypatch
):
    monkeypatch.setattr(runners_module, "GUARD_GRACE_S", 0.3)
    manager = RewardManager(
        RewardFnRef(str(reward_file), "compute_score"),
        executor="process",
        num_workers=1,
        timeout_s=0.3,
    )
    try:
        warm = await manager.score(RewardRequest("toy", "a", "a", {}))
        assert warm.score == 1.0
        stuck = await manager.score(RewardRequest("toy", "a", "a", {"mode": "stuck"}))
        assert stuck.timed_out and stuck.score == 0.0
        after = await manager.score(RewardRequest("toy", "a", "a", {}))
        assert after.score == 1.0
    finally:
        manager.close()
