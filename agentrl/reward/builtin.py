"""Built-in scorers, chosen by a row's ``data_source``.

``default_compute_score`` looks ``data_source`` up by exact name, then by the longest
registered prefix, and falls back to the lenient math scorer (boxed answer, ``####`` or
final number). Competition sources (``aime*``, ``math_dapo*``, ``dapo*``) accept only a
``\\boxed{}`` answer, so a stray last number in unfinished reasoning earns nothing.
Recipes add their own with ``@register_scorer("my_source")``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentrl.reward.math_score import compute_score as _math_score

__all__ = [
    "ScoreFn",
    "boxed_math_scorer",
    "default_compute_score",
    "get_scorer",
    "math_scorer",
    "register_scorer",
]

ScoreFn = Callable[[str, str, Any, "dict[str, Any] | None"], "float | dict[str, Any]"]

_SCORERS: dict[str, ScoreFn] = {}


def register_scorer(*data_sources: str) -> Callable[[ScoreFn], ScoreFn]:
    """Register a scorer for data sources named (or prefixed) by ``data_sources``."""

    def decorate(fn: ScoreFn) -> ScoreFn:
        for source in data_sources:
            _SCORERS[source] = fn
        return fn

    return decorate


def math_scorer(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None
) -> dict[str, Any]:
    """Boxed answer, else ``#### x``, else the final number, compared after normalisation."""
    return _math_score(solution_str, ground_truth)


@register_scorer("aime", "math_dapo", "dapo")
def boxed_math_scorer(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None
) -> dict[str, Any]:
    """Only a ``\\boxed{}`` answer counts."""
    return _math_score(solution_str, ground_truth, require_boxed=True)


def get_scorer(data_source: str) -> ScoreFn:
    """The scorer for ``data_source``: exact match, longest prefix, else ``math_scorer``."""
    if data_source in _SCORERS:
        return _SCORERS[data_source]
    prefixes = [p for p in _SCORERS if data_source.lower().startswith(p.lower())]
    return _SCORERS[max(prefixes, key=len)] if prefixes else math_scorer


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
) -> float | dict[str, Any]:
    """Score with the built-in scorer registered for ``data_source``."""
    return get_scorer(data_source)(data_source, solution_str, ground_truth, extra_info)
