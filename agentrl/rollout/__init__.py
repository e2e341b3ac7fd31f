"""Rollout orchestration: episode requests, agent-loop workers and the manager.

``rollout(config, out=...)`` (``agentrl.rollout.run``) runs the agent loops over a
dataset without training and writes one JSON line per episode; ``await arollout(...)`` does
the same from a running event loop.

This package is itself callable: ``agentrl.rollout(config, ...)`` calls
``agentrl.rollout.run.rollout``. Python binds ``agentrl.rollout`` to this package as soon
as any of its modules is imported, so the package, not the function, is what that name
holds; being callable, it works as the function does in either import order.
"""

from __future__ import annotations

import inspect
import sys
from types import ModuleType
from typing import Any

__all__ = ["RolloutResult", "arollout", "rollout"]


def __getattr__(name: str) -> Any:
    # Lazy, so that importing the manager or the worker does not load the reward stack.
    if name in __all__:
        from agentrl.rollout import run

        return getattr(run, name)
    raise AttributeError(f"module 'agentrl.rollout' has no attribute {name!r}")


def _rollout() -> Any:
    from agentrl.rollout.run import rollout

    return rollout


class _CallableRolloutPackage(ModuleType):
    """This package's class: calling it calls ``agentrl.rollout.run.rollout``, and its
    ``__doc__`` and ``__signature__`` are that function's (``help``, ``inspect``)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _rollout()(*args, **kwargs)

    @property
    def __doc__(self) -> str | None:  # type: ignore[override]
        return _rollout().__doc__

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(_rollout())


sys.modules[__name__].__class__ = _CallableRolloutPackage
