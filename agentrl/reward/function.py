"""``RewardFunction``: the signature of a user reward function."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol, runtime_checkable

__all__ = ["RewardFunction"]


@runtime_checkable
class RewardFunction(Protocol):
    """A reward function: ``compute_score(data_source, solution_str, ground_truth,
    extra_info) -> float | dict``.

    The trainer and ``rollout`` call it once per finished episode, by keyword, with the
    row's ``data_source``, the decoded response of the episode's last output
    (``solution_str``), the row's ``reward_model.ground_truth`` and a dict
    ``extra_info`` (the row's ``extra_info`` plus the episode's ``num_turns`` and
    ``rollout_metrics``, the loop's numeric metrics). It returns the score as a number,
    or a dict that holds ``"score"`` and whose other numeric entries (``acc``, ...) are
    logged as ``reward/<name>/mean``. It may be ``async def``. A config names it with
    ``reward.reward_fn_path`` (a ``.py`` file or a dotted module) and
    ``reward.reward_fn_name`` (default ``compute_score``).
    """

    def __call__(
        self,
        data_source: str,
        solution_str: str,
        ground_truth: Any,
        extra_info: dict[str, Any],
    ) -> float | dict[str, Any] | Awaitable[float | dict[str, Any]]: ...
