"""Load a user reward function ``compute_score(data_source, solution_str, ground_truth,
extra_info) -> float | dict`` from a file path (or module) and a function name.

A dict result must hold ``"score"``; its other numeric entries (``acc``, ...) become
metrics. The function may be ``async def``.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.plugins import load_object
from agentrl.reward.builtin import ScoreFn

__all__ = ["RewardFnRef", "load_reward_fn"]

_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")


def load_reward_fn(path: str | Path, name: str = "compute_score") -> ScoreFn:
    """Import ``name`` from ``path`` and check it can be called with the four reward
    arguments by keyword; raise a ``TypeError`` naming the function otherwise."""
    fn = load_object(path, name)
    if not callable(fn):
        raise TypeError(f"reward function {path}:{name} is not callable ({type(fn).__name__})")
    try:
        inspect.signature(fn).bind(**dict.fromkeys(_ARGS))
    except TypeError as exc:
        raise TypeError(
            f"reward function {path}:{name} must accept ({', '.join(_ARGS)}) by keyword: {exc}"
        ) from None
    except ValueError:  # builtins without a signature: trust them
        pass
    return fn


@dataclass(frozen=True)
class RewardFnRef:
    """A picklable reference to a reward function, resolved inside worker processes."""

    path: str
    name: str

    def resolve(self) -> ScoreFn:
        """The function (imported once per process)."""
        return _resolve_cached(self.path, self.name)


@functools.cache
def _resolve_cached(path: str, name: str) -> Any:
    return load_reward_fn(path, name)
