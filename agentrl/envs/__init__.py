"""Text environments: one protocol, an agent loop that runs them, and package adapters.

- ``TextEnv``: async ``reset(row, seed) -> (messages, info)`` and ``step(message) ->
  StepResult`` (``SyncTextEnv``: the same with plain methods);
- ``EnvAgentLoop`` (``agent_name: env``): runs the environment of ``rollout.env`` with
  the model, token-exact, with per-turn rewards;
- sources: ``reasoning_gym:NAME``, ``gymnasium:ID``, ``textarena:ID``,
  ``verifiers:TASKSET``, ``openenv:URL`` / ``openenv:pkg.module:app`` (each needs its
  package: ``pip install 'agentrl[envs]'``), names registered with ``@register_env``, and
  ``pkg.module:factory``.

Names load on first use: importing ``agentrl.envs`` loads no environment package.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "TextEnv": "agentrl.envs.base",
    "SyncTextEnv": "agentrl.envs.base",
    "StepResult": "agentrl.envs.base",
    "EnvError": "agentrl.envs.base",
    "EnvConfig": "agentrl.envs.config",
    "EnvRunner": "agentrl.envs.runner",
    "register_env": "agentrl.envs.registry",
    "env_factory": "agentrl.envs.registry",
    "available_envs": "agentrl.envs.registry",
    "UnknownEnvError": "agentrl.envs.registry",
    "EnvAgentLoop": "agentrl.envs.loop",
    "aggregate_rewards": "agentrl.envs.loop",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentrl.envs' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
