"""The capacity planner (``agentrl simulate``): bad input, the recorded shapes, the split
search, and the replay of a workload through real simulated engines on a virtual clock."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import namedtuple

import pytest

from agentrl.cli import main
from agentrl.config import load_config
from agentrl.core.trajectory import AgentLoopOutput
from agentrl.rollout.episode import EpisodeResult
from agentrl.server.sim_profiles import get_profile
from agentrl.sim_planner import (
    REPLICA_PROCESS_BYTES,
    EpisodeShape,
    Split,
    SplitResult,
    TrainerCost,
    VirtualClockLoop,
    Workload,
    candidate_splits,
    choose_split,
    machine_replica_limit,
    replay,
    workload_from_episodes,
)

PROFILE = get_profile("qwen2.5-7b-h100")
SIMULATE = ["simulate", "--profile", "qwen2.5-7b-h100", "--gpus", "8"]


# -- bad input: exit 2, naming the value, before anything starts ---------------------------


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        ([*SIMULATE, "server.engine.sim.kv_cache_tokens=1000"], "kv_cache_tokens=1000"),
        ([*SIMULATE, "server.engine.sim.response_length_p99=4000"], "response_length_p99=4000"),
        ([*SIMULATE, "rollout.max_response_length=1500"], "rollout.max_response_length=1500"),
        ([*SIMULATE, "--time-scale", "0"], "--time-scale=0"),
    ],
)
def test_bad_input_exits_2_naming_the_value(argv, named, caplog):
    assert main(argv) == 2
    assert named in caplog.text


def test_an_unknown_profile_lists_the_available_ones(caplog):
    assert main(["simulate", "--profile", "h1000", "--gpus", "8"]) == 2
    assert "'h1000'" in caplog.text
    assert "qwen2.5-7b-h100, llama3.1-8b-h200, qwen2.5-32b-tp4-h100" in caplog.text


def test_too_few_gpus_say_what_a_replica_and_the_trainer_take(caplog):
    assert main(["simulate", "--profile", "qwen2.5-32b-tp4-h100", "--gpus", "10"]) == 2
    assert "--gpus=10 is too few" in caplog.text and "--gpus >= 11" in caplog.text
    assert "takes 4 GPU(s)" in caplog.text  # tp4
    assert "at least 7" in caplog.text  # 32.5B x 16 bytes over 77 GB per H100


def test_more_replicas_than_the_machine_holds_is_refused(monkeypatch, caplog):
    memory = namedtuple("memory", "available")
    monkeypatch.setattr("psutil.virtual_memory", lambda: memory(3 * REPLICA_PROCESS_BYTES))
    argv = ["simulate", "--profile", "qwen2.5-7b-h100", "--gpus", "64", "server.num_replicas=8"]
    assert main(argv) == 2
    assert "server.num_replicas=8" in caplog.text
    assert "holds about 3" in caplog.text


def test_bad_input_answers_without_loading_torch_or_ray():
    code = (
        "import sys\nfrom agentrl.cli import main\n"
        "code = main(['simulate', '--profile', 'qwen2.5-7b-h100', '--gpus', '1'])\n"
        "print(sorted(m for m in ('torch', 'ray', 'transformers') if m in sys.modules))\n"
        "sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2
    assert "--gpus=1 is too few" in done.stderr
    assert done.stdout.strip() == "[]"


# -- the recorded workload ------------------------------------------------------------------


def _output(mask: list[int], metrics: dict | None = None) -> AgentLoopOutput:
    n = len(mask)
    versions = [0 if m else -1 for m in mask]
    return AgentLoopOutput(
        [7, 8, 9], list(range(100, 100 + n)), mask, [0.0] * n, versions, metrics=metrics or {}
    )


def test_an_episodes_model_turns_are_the_runs_of_its_mask():
    shape = EpisodeShape.from_output(0, _output([1, 1, 0, 0, 0, 1, 1, 1, 0, 1]), env_s=3.0)
    assert shape.turns == [(0, 2), (5, 3), (9, 1)]
    assert shape.model_tokens == 6
    assert shape.sequence_length == 13
    assert shape.gap_s == 1.5  # 3 s over the 2 gaps between 3 turns


def _result(group: str, mask: list[int], latency: float = 0.5, **metrics) -> EpisodeResult:
    return EpisodeResult(
        f"e-{group}-{latency}",
        group,
        0,
        0,
        "loop",
        outputs=[_output(mask, metrics)],
        latency_s=latency,
    )


def test_the_workload_keeps_complete_groups_and_the_loops_tool_time():
    episodes = [
        _result("a", [1, 0, 1], latency=2.0, tool_time_s=0.25),
        _result("a", [1], latency=0.1),
        _result("b", [1], latency=0.3),
        EpisodeResult("e-b-2", "b", 0, 1, "loop", error="tool crashed"),
    ]
    workload = workload_from_episodes(episodes, group_size=2, batch_groups=1)
    assert [[e.env_s for e in g] for g in workload.groups] == [[0.25, 0.1]]
    with pytest.raises(ValueError, match=r"no complete group of 2 .*tool crashed"):
        workload_from_episodes(episodes[3:], group_size=2, batch_groups=1)


def test_the_trainer_passes_follow_the_algorithm():
    def passes(*overrides: str) -> float:
        return TrainerCost.from_config(load_config(None, list(overrides))).passes

    assert passes("algorithm.adv_estimator=grpo") == 3 + 1  # update + old-log-prob recompute
    assert passes("algorithm.adv_estimator=grpo", "trainer.old_log_probs=rollout") == 3
    assert passes("algorithm.adv_estimator=grpo", "algorithm.kl.use_kl_loss=true") == 5
    assert passes("algorithm.adv_estimator=gae") == 4 + 1 + 3  # + values + critic update


# -- the split search ---------------------------------------------------------------------


def test_candidate_splits_give_the_rest_to_the_trainer():
    splits = candidate_splits(20, gpus_per_replica=4, min_train_gpus=7)
    assert [(s.replicas, s.rollout_gpus, s.train_gpus) for s in splits] == [
        (1, 4, 16),
        (2, 8, 12),
        (3, 12, 8),
    ]


def _evaluate(peak: int, seen: list[int]):
    def evaluate(split: Split) -> SplitResult:
        seen.append(split.replicas)
        rate = 1000.0 - (split.replicas - peak) ** 2
        return SplitResult(split, 1.0, rate, 0.5, 0.5, 0.1)

    return evaluate


def test_few_splits_are_all_evaluated():
    seen: list[int] = []
    splits = candidate_splits(10, 1, 2)
    best, tried = choose_split(splits, _evaluate(peak=5, seen=seen))
    assert sorted(seen) == list(range(1, 9))
    assert best.split.replicas == 5 and len(tried) == 8


@pytest.mark.parametrize("peak", [1, 17, 58, 200])
def test_many_splits_are_searched_coarse_then_fine(peak):
    seen: list[int] = []
    splits = candidate_splits(202, 1, 2)  # 200 splits
    best, tried = choose_split(splits, _evaluate(peak=peak, seen=seen))
    assert best.split.replicas == peak
    assert len(seen) == len(set(seen)) < 60  # each at most once, far fewer than 200
    assert [r.split.replicas for r in tried] == sorted(seen)


# -- the replay -------------------------------------------------------------------------------


def test_the_virtual_clock_jumps_instead_of_sleeping():
    loop = VirtualClockLoop()

    async def sleeps() -> float:
        await asyncio.gather(asyncio.sleep(3600), asyncio.sleep(60))
        return loop.time()

    try:
        assert loop.run_until_complete(asyncio.wait_for(sleeps(), timeout=7200)) == 3600
    finally:
        loop.close()


def _workload(lengths: list[int], gap_s: float = 0.0) -> Workload:
    """Groups of 2 two-turn episodes: a turn of ``length`` tokens, 8 tool tokens, another."""
    groups = []
    for i, length in enumerate(lengths):
        mask = [1] * length + [0] * 8 + [1] * length
        shape = EpisodeShape.from_output(i, _output(mask), env_s=gap_s)
        groups.append([shape, shape])
    return Workload(groups, group_size=2, batch_groups=4)


CFG = load_config(
    None,
    ["server.engine.backend=sim", "server.engine.max_model_len=4096", "workers.backend=sim"],
)
COST = TrainerCost.from_config(CFG)


def _replay(workload: Workload, replicas: int, train_gpus: int, eta: int) -> SplitResult:
    split = Split(replicas, 1, train_gpus)
    return replay(workload, CFG, split, COST, PROFILE, max_staleness=eta)


def test_a_sync_step_is_generation_then_training():
    result = _replay(_workload([400, 50, 50, 50, 1200, 60, 70, 80]), 2, 2, eta=0)
    # Sync: the trainer computes only between batches, so it is busy train_s per step.
    assert result.trainer_busy * result.step_s == pytest.approx(result.train_s, rel=1e-6)
    # The longest turn (1200 tokens, each at least the 4.5 ms weight-read floor) ends a batch.
    assert result.step_s - result.train_s > 1200 * 4.5e-3
    assert 0 < result.pool_busy < 1


def test_async_overlaps_what_sync_serializes():
    workload = _workload([300, 900, 200, 400, 350, 800, 250, 500], gap_s=0.5)
    sync = _replay(workload, 2, 2, eta=0)
    eta1 = _replay(workload, 2, 2, eta=1)
    assert eta1.trained_tokens_per_s > 1.2 * sync.trained_tokens_per_s
    assert eta1.trainer_busy > sync.trainer_busy


def test_episodes_older_than_eta_are_dropped_unless_down_weighted():
    workload = _workload([100] * 7 + [500])  # one group runs for about 3 steps
    dropped = _replay(workload, 2, 2, eta=1)
    assert dropped.dropped_stale > 0
    trainer = CFG.trainer.model_copy(update={"stale_policy": "downweight"})
    cfg = CFG.model_copy(update={"trainer": trainer})
    kept = replay(workload, cfg, Split(2, 1, 2), COST, PROFILE, max_staleness=1)
    assert kept.dropped_stale == 0


def test_training_gpus_shorten_a_trainer_bound_step():
    workload = _workload([2000] * 8)
    few, many = _replay(workload, 2, 2, eta=1), _replay(workload, 2, 8, eta=1)
    assert many.train_s < few.train_s / 2
    assert many.step_s < few.step_s


def test_the_replica_limit_is_the_tighter_of_memory_and_cores():
    plenty = 1000 * REPLICA_PROCESS_BYTES
    assert machine_replica_limit(plenty, cores=2) == 50  # idle replicas: half of 2 cores
    assert machine_replica_limit(10 * REPLICA_PROCESS_BYTES, cores=64) == 10
    assert machine_replica_limit(0, cores=2) == 1
