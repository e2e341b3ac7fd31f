"""The reward function of environment episodes: the reward the environment gave.

Set ``reward.reward_fn_path: agentrl.envs.reward`` for rows run by ``agent_name: env``:
``compute_score`` returns the episode's reward as ``EnvAgentLoop`` aggregated it
(``rollout.env.reward_aggregate`` of the per-turn rewards), which reaches the reward
function as the output's ``env/reward`` metric.
"""

from __future__ import annotations

from typing import Any

ENV_REWARD_METRIC = "env/reward"


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None
) -> float:
    """The environment's episode reward; raises ``ValueError`` for an episode that did not
    run in an environment (a row without ``agent_name: env``)."""
    metrics = (extra_info or {}).get("rollout_metrics") or {}
    if ENV_REWARD_METRIC not in metrics:
        raise ValueError(
            f"no {ENV_REWARD_METRIC!r} in the episode's metrics: agentrl.envs.reward scores "
            f"episodes of the `env` agent loop only (data_source {data_source!r})"
        )
    return float(metrics[ENV_REWARD_METRIC])
