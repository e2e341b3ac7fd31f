"""The ``reward`` section of the configuration tree."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agentrl.core.config import Section

__all__ = ["RewardConfig"]


class RewardConfig(Section):
    """Which reward function scores responses, and how calls to it are run."""

    reward_fn_path: str | None = Field(
        None,
        description="Python file or module defining the reward function; None = built-in "
        "scorers chosen by data_source (math: boxed answer or final number).",
    )
    reward_fn_name: str = Field(
        "compute_score",
        description="Function in `reward_fn_path`: (data_source, solution_str, ground_truth, "
        "extra_info) -> float | dict with 'score'.",
    )
    executor: Literal["thread", "process"] = Field(
        "thread",
        description="Where reward calls run: `thread` (cheap; a timed-out call is abandoned) "
        "or `process` (spawn pool; CPU-heavy scorers, hard timeouts).",
    )
    num_workers: int = Field(4, ge=1, description="Reward calls running at once.")
    timeout_s: float = Field(
        30.0, gt=0, description="Per-call limit in seconds; a call past it scores 0."
    )
