"""ReTool reward: +1 for a correct final answer, −1 otherwise, with a tool-use bonus.

The final answer is the last ``\\boxed{}`` or, failing that, the last number (see
``agentrl.reward.math_score``). A wrong answer that used the code interpreter gets
``TOOL_BONUS`` back, which ReTool uses early on so the model keeps trying the tool.
Tool use is detected from the model's own ``<tool_call>`` tags (how the tool's answer is
rendered depends on the chat template: ``<tool_response>`` for Qwen, a ``tool`` turn for
SmolLM2).
``extra_info["tool_bonus"]`` overrides it per row (0 turns it off).
"""

from __future__ import annotations

from agentrl.reward.math_score import compute_score as math_score

TOOL_BONUS = 0.1
TOOL_CALL_TAG = "<tool_call>"


def compute_score(data_source, solution_str, ground_truth, extra_info):
    result = math_score(solution_str, ground_truth)
    used_tool = TOOL_CALL_TAG in solution_str
    bonus = float((extra_info or {}).get("tool_bonus", TOOL_BONUS))
    correct = result["score"] >= 1.0
    score = 1.0 if correct else -1.0 + (bonus if used_tool else 0.0)
    return {"score": score, "acc": float(correct), "tool_used": float(used_tool)}
