"""`agentrl rollout`'s records and its checks that run before anything starts."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from agentrl.config import ConfigError, load_config
from agentrl.core.trajectory import ENV_TOKEN_VERSION, AgentLoopOutput
from agentrl.reward.manager import RewardResult
from agentrl.rollout.episode import EpisodeResult
from agentrl.rollout.run import arollout, episode_messages, rollout, trajectory_record

PROMPT = [{"role": "user", "content": "What is 2 + 2?"}]
ROW = {"prompt": PROMPT, "data_source": "arithmetic", "reward_model": {"ground_truth": "4"}}


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    return AutoTokenizer.from_pretrained(tiny_checkpoint)


def _output(tokenizer, parts, tool_reward=None):
    """An output whose response is ``parts``: (text, from_model) spans."""
    ids, mask, logprobs, versions = [], [], [], []
    for text, from_model in parts:
        span = tokenizer.encode(text)
        ids += span
        mask += [int(from_model)] * len(span)
        logprobs += [-0.5 if from_model else 0.0] * len(span)
        versions += [3 if from_model else ENV_TOKEN_VERSION] * len(span)
    extra = {} if tool_reward is None else {"tool_reward": tool_reward}
    return AgentLoopOutput(
        tokenizer.encode("prompt"),
        ids,
        mask,
        logprobs,
        versions,
        num_turns=len(parts),
        metrics={"attempts": 2},
        extra=extra,
    )


def test_messages_are_the_prompt_then_one_message_per_response_span(tokenizer):
    out = _output(tokenizer, [("It is 5.", True), ("<|im_start|>user\nAgain.", False), ("4", True)])
    messages = episode_messages(PROMPT, out, tokenizer)
    assert messages == [
        PROMPT[0],
        {"role": "assistant", "content": "It is 5."},
        {"role": "env", "content": "<|im_start|>user\nAgain."},
        {"role": "assistant", "content": "4"},
    ]


def test_record_of_a_scored_episode_adds_the_tool_reward(tokenizer):
    first, last = _output(tokenizer, [("a", True)]), _output(tokenizer, [("b", True)], 0.25)
    episode = EpisodeResult("ep-1", "grp-1", 0, 1, "retry", outputs=[first, last])
    record = trajectory_record(episode, ROW, tokenizer, RewardResult(1.0, {"acc": 1.0}))
    assert record["reward"] == 1.25
    assert record["reward_info"] == {"acc": 1.0}
    assert record["error"] is None
    assert record["response_ids"] == last.response_ids
    assert record["response_versions"] == last.response_versions
    assert record["messages"][-1] == {"role": "assistant", "content": "b"}
    (earlier,) = record["earlier_samples"]
    assert earlier["response_ids"] == first.response_ids
    assert (record["episode_id"], record["group_id"], record["sample_index"]) == (
        "ep-1",
        "grp-1",
        1,
    )


def test_record_of_a_failed_episode_has_the_error_and_no_tokens(tokenizer):
    episode = EpisodeResult("ep-2", "grp-2", 3, 0, "guess", error="ValueError: boom")
    record = trajectory_record(episode, ROW, tokenizer, None)
    assert record["error"] == "ValueError: boom"
    assert record["reward"] is None
    assert record["response_ids"] == [] and record["response_mask"] == []
    assert record["messages"] == PROMPT


def test_reward_function_failure_is_kept_in_the_record(tokenizer):
    episode = EpisodeResult("ep-3", "g", 0, 0, "x", outputs=[_output(tokenizer, [("a", True)])])
    record = trajectory_record(episode, ROW, tokenizer, RewardResult(0.0, error="KeyError: 'x'"))
    assert record["reward"] == 0.0
    assert record["reward_info"] == {"reward_error": "KeyError: 'x'"}


def test_rollout_refuses_an_empty_split_before_starting_anything(tiny_checkpoint, tmp_path):
    cfg = load_config(None, [f"model.path={tiny_checkpoint}", "data.val_files=[v.jsonl]"])
    with pytest.raises(ConfigError, match=r"data.train_files is empty.*val split"):
        rollout(cfg, tmp_path / "t.jsonl", split="train")
    with pytest.raises(ConfigError, match="limit must be at least 1"):
        rollout(cfg, tmp_path / "t.jsonl", split="val", limit=0)
    with pytest.raises(ConfigError, match=r"model\.path is required"):
        rollout(load_config(None, []), tmp_path / "t.jsonl")
    assert not (tmp_path / "t.jsonl").exists()


async def test_in_a_running_event_loop_rollout_points_to_arollout(tiny_checkpoint, tmp_path):
    cfg = load_config(None, [f"model.path={tiny_checkpoint}", "data.val_files=[v.jsonl]"])
    with pytest.raises(RuntimeError, match=r"use `await arollout\(\.\.\.\)`"):
        rollout(cfg, tmp_path / "t.jsonl", split="val")
    with pytest.raises(ConfigError, match=r"data.train_files is empty"):
        await arollout(cfg, tmp_path / "t.jsonl", split="train")
    assert not (tmp_path / "t.jsonl").exists()
