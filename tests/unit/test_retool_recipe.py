"""The ReTool recipe's reward and tool config."""

from __future__ import annotations

from pathlib import Path

from agentrl.reward.loader import load_reward_fn
from agentrl.tools import load_tools

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "retool"


def test_reward_is_plus_minus_one_with_tool_bonus_on_wrong_answers():
    score = load_reward_fn(str(RECIPE / "reward.py"), "compute_score")
    right = score("m", "so it is \\boxed{4}", "4", {})
    wrong = score("m", "so it is \\boxed{5}", "4", {})
    wrong_with_tool = score("m", "<tool_response>\n5\n</tool_response> \\boxed{5}", "4", {})
    no_bonus = score("m", "<tool_response>5</tool_response> \\boxed{5}", "4", {"tool_bonus": 0})
    assert (right["score"], right["acc"]) == (1.0, 1.0)
    assert (wrong["score"], wrong["acc"]) == (-1.0, 0.0)
    assert wrong_with_tool["score"] == -0.9 and wrong_with_tool["tool_used"] == 1.0
    assert no_bonus["score"] == -1.0


def test_tool_config_loads_the_sandboxed_code_interpreter():
    tools = load_tools(RECIPE / "tools.yaml")
    assert list(tools) == ["code_interpreter"]
