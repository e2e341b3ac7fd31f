"""Rollout orchestration: episode requests, agent-loop workers and the manager.

``rollout(config, out=...)`` (``agentrl.rollout.run``) runs the agent loops over a
dataset without training and writes one JSON line per episode; ``await arollout(...)`` does
the same from a running event loop.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RolloutResult", "arollout", "rollout"]


def __getattr__(name: str) -> Any:
    # Lazy, so that importing the manager or the worker does not load the reward stack.
    if name in __all__:
        from agentrl.rollout import run

        return getattr(run, name)
    raise AttributeError(f"module 'agentrl.rollout' has no attribute {name!r}")
