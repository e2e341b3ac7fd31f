"""agentrl: asynchronous agentic reinforcement learning for LLMs.

The names users write against, in one namespace: agent loops (``AgentLoopBase``,
``register_agent_loop``, ``Conversation``, ``TrajectoryBuilder``), tools (``tool``,
``BaseTool``), the config (``load_config``), rollouts without training (``rollout``,
``arollout``), the rollout servers and the reward-function signature
(``RewardFunction``). ``agentrl.testing`` holds what a test of a loop needs without a
model.

Every name loads on first use, from the module that defines it (which stays importable
under its own path): ``import agentrl`` loads no torch, Ray, vLLM or transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> the module that defines it
_EXPORTS = {
    "AgentLoopBase": "agentrl.agent_loops.base",
    "register_agent_loop": "agentrl.agent_loops.registry",
    "Conversation": "agentrl.agent_loops.conversation",
    "AgentLoopOutput": "agentrl.core.trajectory",
    "TrajectoryBuilder": "agentrl.core.trajectory",
    "SamplingParams": "agentrl.core.types",
    "tool": "agentrl.tools.decorator",
    "BaseTool": "agentrl.tools.base",
    "ToolResponse": "agentrl.tools.base",
    "OpenAIFunctionToolSchema": "agentrl.tools.schema",
    "load_config": "agentrl.config",
    "AgentRLConfig": "agentrl.config",
    "ConfigError": "agentrl.config",
    "RewardFunction": "agentrl.reward.function",
    "rollout": "agentrl.rollout",
    "arollout": "agentrl.rollout.run",
    "init_ray": "agentrl.server.launch",
    "start_rollout_servers": "agentrl.server.launch",
    "stop_rollout_servers": "agentrl.server.launch",
    "resolve_model_config": "agentrl.models",
    "ObjectStoreSync": "agentrl.server.weight_transport.object_store",
}

__all__ = [
    "AgentLoopBase",
    "AgentLoopOutput",
    "AgentRLConfig",
    "BaseTool",
    "ConfigError",
    "Conversation",
    "ObjectStoreSync",
    "OpenAIFunctionToolSchema",
    "RewardFunction",
    "SamplingParams",
    "ToolResponse",
    "TrajectoryBuilder",
    "__version__",
    "arollout",
    "init_ray",
    "load_config",
    "register_agent_loop",
    "resolve_model_config",
    "rollout",
    "start_rollout_servers",
    "stop_rollout_servers",
    "tool",
]

if TYPE_CHECKING:
    from agentrl.agent_loops.base import AgentLoopBase
    from agentrl.agent_loops.conversation import Conversation
    from agentrl.agent_loops.registry import register_agent_loop
    from agentrl.config import AgentRLConfig, ConfigError, load_config
    from agentrl.core.trajectory import AgentLoopOutput, TrajectoryBuilder
    from agentrl.core.types import SamplingParams
    from agentrl.models import resolve_model_config
    from agentrl.reward.function import RewardFunction
    from agentrl.rollout.run import arollout, rollout
    from agentrl.server.launch import init_ray, start_rollout_servers, stop_rollout_servers
    from agentrl.server.weight_transport.object_store import ObjectStoreSync
    from agentrl.tools.base import BaseTool, ToolResponse
    from agentrl.tools.decorator import tool
    from agentrl.tools.schema import OpenAIFunctionToolSchema


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentrl' has no attribute {name!r}")
    if name == "rollout":
        # The subpackage agentrl.rollout, made callable as rollout(...) (see its
        # __init__): importing any agentrl.rollout.* module sets this attribute to it.
        value = importlib.import_module(module)
    else:
        value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
