"""ReTool reward: +1 for a correct final answer, −1 otherwise, a tool-use bonus on wrong
answers, and a small penalty for tool calls that failed.

The final answer is the last ``\\boxed{}`` or, failing that, the last number (see
``agentrl.reward.math_score``). A wrong answer that called the code interpreter gets
``TOOL_BONUS`` back, which ReTool uses early on so the model keeps trying the tool. An
episode with a tool call that did not run (malformed JSON, unknown tool, bad arguments,
a timeout) loses ``FAILED_CALL_PENALTY``, right or wrong.

The penalty is smaller than the bonus on purpose. GRPO divides a group's advantages by
its reward spread, so in a group where every answer is wrong these small terms alone
decide the signs, and their order is what the policy learns there: a call that ran
(−0.9) beats a call that failed (−0.95), which beats no call (−1.0). Without the penalty
a small model learned to emit more and more broken calls (valid-call rate 0.65 → 0.26 in
four steps); with a penalty larger than the bonus (failed calls below no call) it learned
to stop calling the tool (training tool use 0.64 → 0.56 in 8 steps).

The call counts come from the agent loop (``extra_info["rollout_metrics"]``: ``tool_calls``
and ``tool_calls/ok``). Without them (scoring text offline) a ``<tool_call>`` tag counts as
a call that ran. ``extra_info["tool_bonus"]`` and ``extra_info["failed_call_penalty"]``
override the constants per row (0 turns either off).

Rows of the no-tool control (``extra_info["control"] == "no_tool"``: the held-out problems
answered without tools, see ``prepare_data.py --control-instruction``) report their
accuracy as ``no_tool_acc`` instead of ``acc``, so ``val/acc`` covers the tool rows only
and ``val/no_tool_acc`` the control (their ±1 scores do count in ``val/score``).
"""

from __future__ import annotations

from typing import Any

from agentrl.reward.math_score import compute_score as math_score

TOOL_BONUS = 0.1
FAILED_CALL_PENALTY = 0.05
TOOL_CALL_TAG = "<tool_call>"


def _call_counts(solution_str: str, extra_info: dict[str, Any]) -> tuple[float, float]:
    """(calls that ran, calls that failed)."""
    metrics = extra_info.get("rollout_metrics")
    if metrics is None:
        return float(TOOL_CALL_TAG in solution_str), 0.0
    ran = float(metrics.get("tool_calls/ok", 0))
    return ran, float(metrics.get("tool_calls", 0)) - ran


def compute_score(data_source, solution_str, ground_truth, extra_info):
    extra_info = extra_info or {}
    correct = math_score(solution_str, ground_truth)["score"] >= 1.0
    if extra_info.get("control") == "no_tool":
        return {"score": 1.0 if correct else -1.0, "no_tool_acc": float(correct)}
    ran, failed = _call_counts(solution_str, extra_info)
    called = ran + failed > 0
    bonus = float(extra_info.get("tool_bonus", TOOL_BONUS))
    penalty = float(extra_info.get("failed_call_penalty", FAILED_CALL_PENALTY))
    score = 1.0 if correct else -1.0 + (bonus if called else 0.0)
    if failed:
        score -= penalty
    return {
        "score": score,
        "acc": float(correct),
        "tool_used": float(called),
        "failed_calls": float(failed > 0),
    }
