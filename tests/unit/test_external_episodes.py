"""Gateway sessions as external episodes: conversion, and the queue's unreserved path."""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoTokenizer

from agentrl.core.trajectory import AgentLoopOutput
from agentrl.rollout.episode import EpisodeResult, episode_from_session
from agentrl.rollout.queue import TrajectoryQueue
from agentrl.trainer.steps import score_episodes


def _sample(version: int = 0, reward: float | None = None) -> AgentLoopOutput:
    """A sample as the gateway builds it: model, tool, model."""
    return AgentLoopOutput(
        prompt_ids=[1, 2],
        response_ids=[10, 11, 90, 12],
        response_mask=[1, 1, 0, 1],
        response_logprobs=[-0.1, -0.2, 0.0, -0.3],
        response_versions=[version, version, -1, version],
        num_turns=3,
        reward=reward,
        metrics={"gateway/sample_calls": 2},
        extra={"session_id": "s", "call_ids": ["a", "b"]},
    )


def _reserved(group: str, k: int, version: int = 0) -> EpisodeResult:
    output = AgentLoopOutput([1], [2], [1], [-0.1], [version])
    return EpisodeResult(f"{group}-{k}", group, 0, k, "t", outputs=[output])


def _queue(**kw) -> TrajectoryQueue:
    args = {"batch_groups": 1, "group_size": 2, "max_staleness": 1, "max_concurrency": 64}
    return TrajectoryQueue(**(args | kw))


# -- conversion -----------------------------------------------------------------------


def test_session_becomes_an_external_episode_with_exact_tokens_and_the_session_reward():
    episode = episode_from_session("sess-1", [_sample(reward=0.5), _sample()], 1.0, "ext:g")
    assert (episode.episode_id, episode.group_id, episode.row_index) == ("sess-1", "ext:g", -1)
    assert episode.external and episode.ok and episode.agent_name == "gateway"
    first = episode.outputs[0]
    assert isinstance(first, AgentLoopOutput)
    assert first.response_ids == [10, 11, 90, 12] and first.response_mask == [1, 1, 0, 1]
    assert first.response_logprobs == [-0.1, -0.2, 0.0, -0.3]
    assert first.response_versions == [0, 0, -1, 0]
    assert [o.reward for o in episode.outputs] == [1.0, 1.0]  # the session reward wins
    assert first.extra["call_ids"] == ["a", "b"] and not first.extra["truncated"]


def test_per_call_rewards_are_kept_and_an_unrewarded_sample_counts_zero():
    episode = episode_from_session("s", [_sample(reward=0.5), _sample()], None, "g")
    assert [o.reward for o in episode.outputs] == [0.5, 0.0]


@pytest.mark.parametrize(
    ("samples", "reward", "error"),
    [([], 1.0, "no model calls"), ([_sample()], None, "without a reward")],
)
def test_unusable_sessions_are_failed_episodes(samples, reward, error):
    episode = episode_from_session("s", samples, reward, "g")
    assert not episode.ok and error in episode.error and episode.outputs == []


def test_long_responses_are_cut_like_the_external_loop_does():
    (output,) = episode_from_session("s", [_sample()], 1.0, "g", max_response_length=3).outputs
    assert output.response_ids == [10, 11, 90] and output.extra["truncated"]
    assert output.response_mask == [1, 1, 0] and output.response_versions == [0, 0, -1]
    assert len(output.response_logprobs) == 3


# -- the queue ------------------------------------------------------------------------


async def test_sessions_of_one_group_form_a_group_in_arrival_order():
    q = _queue(group_size=3)
    assert await q.put_session("b", [_sample()], 1.0, "g1") == "accepted"
    assert await q.put_session("x", [_sample()], 0.0, "g2") == "accepted"
    assert await q.put_session("a", [_sample()], 0.0, "g1") == "accepted"
    getter = asyncio.create_task(q.get_batch())
    await asyncio.sleep(0)
    assert not getter.done()  # g1 has 2 of 3
    assert await q.put_session("c", [], 1.0, "g1") == "accepted"  # failed, still a member
    batch = await asyncio.wait_for(getter, 1)
    (group,) = batch.groups
    assert [e.episode_id for e in group] == ["b", "a", "c"]
    assert [e.sample_index for e in group] == [0, 1, 2]
    assert {e.group_id for e in group} == {"ext:g1"}
    assert group[0].outputs[0].extra["client_group_id"] == "g1"
    assert batch.metrics["async/external_episodes"] == 4
    assert batch.metrics["async/failed_episodes"] == 1
    assert batch.metrics["async/open_groups"] == 1  # g2 waits for more sessions


async def test_a_full_group_takes_no_more_sessions():
    q = _queue()
    for sid in ("a", "b"):
        await q.put_session(sid, [_sample()], 1.0, "g")
    assert await q.put_session("c", [_sample()], 1.0, "g") == "group_full"
    batch = await q.get_batch()
    assert [e.episode_id for e in batch.episodes] == ["a", "b"]
    assert await q.put_session("d", [_sample()], 1.0, "g") == "group_full"  # also once taken
    assert q.metrics()["async/external_rejected_group_full"] == 2


async def test_ungrouped_sessions_are_groups_of_one_only_when_groups_have_size_one():
    q = _queue()
    assert await q.put_session("lone", [_sample()], 1.0) == "ungrouped"
    assert q.metrics()["async/external_rejected_ungrouped"] == 1
    assert q.pending_episode_ids() == []

    single = _queue(group_size=1)
    assert await single.put_session("lone", [_sample()], 1.0) == "accepted"
    batch = await asyncio.wait_for(single.get_batch(), 1)
    assert [(e.episode_id, e.group_id) for e in batch.episodes] == [("lone", "ext:lone")]


async def test_a_session_is_accepted_once_and_a_repeat_is_counted_not_raised():
    q = _queue(group_size=1)
    assert await q.put_session("s", [_sample()], 1.0, "g") == "accepted"
    assert await q.put_session("s", [_sample()], 1.0, "g") == "duplicate"
    assert await q.put_session("s", [_sample()], 1.0, "other") == "duplicate"
    assert await q.put_external(episode_from_session("s", [_sample()], 1.0, "ext:h")) == (
        "duplicate"
    )
    metrics = q.metrics()
    assert metrics["async/duplicate_episodes"] == 3
    assert metrics["async/external_episodes"] == 1
    assert q.pending_episode_ids() == ["s"]


async def test_external_episodes_take_no_slot_of_the_staleness_rule():
    q = _queue(max_staleness=0)  # capacity = (0 + 0 + 1) * 2 episodes = 1 group
    for i in range(3):
        for sid in ("a", "b"):
            await q.put_session(f"{sid}{i}", [_sample()], 1.0, f"g{i}")
    assert q.metrics()["async/running"] == 0
    assert await q.reserve(10) == 1  # as if no session had come
    await q.put(_reserved("r", 0))
    await q.put(_reserved("r", 1))
    assert await q.reserve(10) == 0
    # Three external groups and one internal one, handed out oldest first.
    order = [(await q.get_batch()).groups[0][0].group_id for _ in range(4)]
    assert order == ["ext:g0", "ext:g1", "ext:g2", "r"]
    await q.set_version(1)
    assert await q.reserve(10) == 1  # the rule counted only the reserved group


async def test_stale_external_episodes_are_dropped_without_corrupting_the_rule():
    q = _queue(max_staleness=1)
    await q.set_version(3)
    assert await q.reserve(10) == 5  # (1 + 3 + 1) * 2 episodes = 5 groups
    await q.put_session("old", [_sample(version=0)], 1.0, "g")  # 3 versions behind
    await q.put_session("new", [_sample(version=3)], 1.0, "g")
    batch = await asyncio.wait_for(q.get_batch(), 1)
    assert [e.episode_id for e in batch.episodes] == ["new"]
    assert batch.metrics["async/dropped_stale"] == 1
    assert q._rule.accepted == 0 and q._rule.rejected == 0 and q._rule.running == 10
    assert await q.reserve(10) == 0  # still exactly the 5 groups reserved above


async def test_stale_external_episodes_can_be_downweighted():
    q = _queue(max_staleness=0, stale_policy="downweight", group_size=1)
    await q.set_version(2)
    await q.put_session("s", [_sample(version=0)], 1.0, "g")
    (episode,) = (await q.get_batch()).episodes
    assert episode.outputs[0].extra["sample_weight"] == 0.25
    assert q.metrics()["async/downweighted_stale"] == 1


async def test_put_routes_an_external_episode_to_the_unreserved_path():
    q = _queue(group_size=1)
    await q.put(episode_from_session("s", [_sample()], 1.0, "ext:g"))  # no reserve first
    assert q.metrics()["async/external_episodes"] == 1 and q._rule.running == 0


class _NoRewardFn:
    async def score_batch(self, requests):
        from agentrl.reward.manager import RewardBatch

        assert requests == []  # external episodes never reach the reward function
        return RewardBatch([], {"reward/score/mean": 0.0})


async def test_the_trainer_scores_external_episodes_with_their_client_rewards(tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    episodes = [
        episode_from_session("a", [_sample(), _sample()], 1.0, "ext:g"),
        episode_from_session("b", [_sample()], 0.0, "ext:g"),
        episode_from_session("c", [], 1.0, "ext:g"),
    ]
    samples, metrics = await score_episodes(episodes, {}, _NoRewardFn(), tokenizer)
    assert [(s.group_id, s.score) for s in samples] == [("ext:g", 1.0)] * 2 + [("ext:g", 0.0)]
    assert metrics["reward/score/mean"] == 0.5
    assert metrics["rollout/external_episodes"] == 2
    assert metrics["rollout/failed_episodes"] == 1
