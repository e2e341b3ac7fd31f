"""What an episode tells its reward function, and the batch statistics of episodes.

Lives beside the episodes (below the trainer) so that ``agentrl rollout`` and the
trainers describe episodes the same way.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from agentrl.core.trajectory import AgentLoopOutput
from agentrl.rollout.episode import EpisodeResult

__all__ = ["episode_info", "numeric_metrics", "rollout_metrics"]


def numeric_metrics(output: AgentLoopOutput) -> dict[str, int | float]:
    """The output's metrics that are numbers (``tool_calls``, ``tool_calls/ok``, ...)."""
    return {k: v for k, v in output.metrics.items() if isinstance(v, int | float)}


def episode_info(output: AgentLoopOutput) -> dict[str, Any]:
    """What a reward function gets in ``extra_info`` about the episode: ``num_turns`` and
    ``rollout_metrics``, the scored output's numeric metrics (``tool_calls``,
    ``tool_calls/ok``, ``tool_calls/malformed``, ...: see ``ToolAgentLoop``)."""
    return {"num_turns": output.num_turns, "rollout_metrics": numeric_metrics(output)}


def rollout_metrics(episodes: list[EpisodeResult]) -> dict[str, float]:
    """Turns, tool calls by outcome, lengths, drift and latency percentiles of the
    successful ``episodes`` (``rollout/...``; empty when none has an output)."""
    outputs = [o for e in episodes for o in e.outputs]
    if not outputs:
        return {}
    totals: Counter[str] = Counter()
    for output in outputs:
        totals.update(numeric_metrics(output))
    lengths = np.array([o.num_model_tokens for o in outputs], dtype=float)
    latency = np.array([e.latency_s for e in episodes])
    metrics = {
        "rollout/num_turns/mean": float(np.mean([o.num_turns for o in outputs])),
        "rollout/response_length/mean": float(lengths.mean()),
        "rollout/response_length/max": float(lengths.max()),
        "rollout/latency_s/p50": float(np.percentile(latency, 50)),
        "rollout/latency_s/p99": float(np.percentile(latency, 99)),
    }
    for key, value in totals.items():
        metrics[f"rollout/{key}"] = float(value) / len(outputs)
    if totals.get("drift_checked"):
        metrics["rollout/tokenization_drift"] = float(totals.get("tokenization_drift", 0))
    return metrics
