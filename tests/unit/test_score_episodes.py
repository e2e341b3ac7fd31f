"""score_episodes: the reward function sees the row and how the episode went."""

from __future__ import annotations

from transformers import AutoTokenizer

from agentrl.core.trajectory import AgentLoopOutput
from agentrl.reward.manager import RewardManager
from agentrl.rollout.episode import EpisodeResult
from agentrl.trainer.steps import score_episodes

ROW = {"data_source": "d", "reward_model": {"ground_truth": "4"}, "extra_info": {"k": 1}}


async def test_the_reward_function_gets_the_turns_and_tool_call_counts(tiny_checkpoint):
    seen = []

    def reward(data_source, solution_str, ground_truth, extra_info):
        seen.append(extra_info)
        return float(extra_info["rollout_metrics"]["tool_calls/ok"])

    output = AgentLoopOutput(
        [1],
        [5, 6],
        [1, 0],
        [-0.1, 0.0],
        [0, -1],
        num_turns=2,
        metrics={"tool_calls": 2, "tool_calls/ok": 1, "gen_time_s": 0.5, "note": "text"},
    )
    episode = EpisodeResult("e", "g", 0, 0, "tool_agent", outputs=[output])
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    samples, _ = await score_episodes([episode], {"g": ROW}, RewardManager(reward), tokenizer)
    assert [s.score for s in samples] == [1.0]
    assert seen == [
        {
            "k": 1,
            "num_turns": 2,
            "rollout_metrics": {"tool_calls": 2, "tool_calls/ok": 1, "gen_time_s": 0.5},
        }
    ]
