"""agentrl: asynchronous agentic reinforcement learning for LLMs.

The names users write against, in one namespace: agent loops (``AgentLoopBase``,
``register_agent_loop``, ``Conversation``, ``TrajectoryBuilder``), tools (``tool``,
``BaseTool``), the config (``load_config``), rollouts without training (``rollout``,
``arollout``), the rollout servers and the reward-function signature
(``RewardFunction``); then the built-in loops, text environments, the reward manager,
metrics and plots, the algorithms for custom trainers, and the parts a run wires together
(worker, queue, gateway) for running them in-process. ``agentrl.testing`` holds what a
test of a loop needs without a model.

Every name loads on first use, from the module that defines it (which stays importable
under its own path): ``import agentrl`` loads no torch, Ray, vLLM or transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> the module that defines it, or (module, its name there)
_EXPORTS: dict[str, str | tuple[str, str]] = {
    # What a loop, a tool, a config and a rollout are written with (the core contract).
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
    # Built-in loops, tools and parsers, and the rollout config section.
    "ToolAgentLoop": "agentrl.agent_loops.tool_agent",
    "ExternalAgentLoop": "agentrl.agent_loops.external",
    "ExternalAgentConfig": "agentrl.agent_loops.external_config",
    "RolloutConfig": "agentrl.agent_loops.config",
    "load_tools": "agentrl.tools.loader",
    "get_tool_parser": "agentrl.tools.parsers",
    "get_reasoning_parser": "agentrl.tools.reasoning",
    # Text environments.
    "register_env": "agentrl.envs.registry",
    "env_factory": "agentrl.envs.registry",
    "StepResult": "agentrl.envs.base",
    "EnvAgentLoop": "agentrl.envs.loop",
    "reasoning_gym_rows": "agentrl.envs.reasoning_gym",
    "verifiers_tools": "agentrl.envs.verifiers",
    # Rewards, metrics and plots.
    "load_reward_fn": "agentrl.reward.loader",
    "RewardManager": "agentrl.reward.manager",
    "RewardRequest": "agentrl.reward.manager",
    "RewardJudge": "agentrl.reward.judge",
    "JudgeConfig": "agentrl.reward.config",
    "episode_info": "agentrl.rollout.metrics",
    "MetricsLogger": "agentrl.tracking",
    "plot_run": "agentrl.plot",
    # Algorithms on torch tensors, for custom trainers.
    "AdvantageInputs": "agentrl.algos.advantages",
    "compute_advantages": "agentrl.algos.advantages",
    "scores_to_token_rewards": "agentrl.algos.advantages",
    "AlgorithmConfig": "agentrl.algos.config",
    "get_policy_loss": "agentrl.algos.policy_losses",
    "agg_loss": "agentrl.algos.loss_agg",
    "compute_rollout_is_weights": "agentrl.algos.rollout_is",
    # The parts a run wires together, for running them in-process (workers, queue, gateway).
    "AgentLoopWorker": "agentrl.rollout.worker",
    "make_requests": "agentrl.rollout.episode",
    "TrajectoryQueue": "agentrl.rollout.queue",
    "GatewayConfig": "agentrl.server.gateway.config",
    "GatewayService": "agentrl.server.gateway.service",
    "gateway_app": ("agentrl.server.gateway.app", "build_app"),
    "InMemorySink": "agentrl.server.gateway.sink",
    "QueueSink": "agentrl.server.gateway.sink",
}

__all__ = [
    "AdvantageInputs",
    "AgentLoopBase",
    "AgentLoopOutput",
    "AgentLoopWorker",
    "AgentRLConfig",
    "AlgorithmConfig",
    "BaseTool",
    "ConfigError",
    "Conversation",
    "EnvAgentLoop",
    "ExternalAgentConfig",
    "ExternalAgentLoop",
    "GatewayConfig",
    "GatewayService",
    "InMemorySink",
    "JudgeConfig",
    "MetricsLogger",
    "ObjectStoreSync",
    "OpenAIFunctionToolSchema",
    "QueueSink",
    "RewardFunction",
    "RewardJudge",
    "RewardManager",
    "RewardRequest",
    "RolloutConfig",
    "SamplingParams",
    "StepResult",
    "ToolAgentLoop",
    "ToolResponse",
    "TrajectoryBuilder",
    "TrajectoryQueue",
    "__version__",
    "agg_loss",
    "arollout",
    "compute_advantages",
    "compute_rollout_is_weights",
    "env_factory",
    "episode_info",
    "gateway_app",
    "get_policy_loss",
    "get_reasoning_parser",
    "get_tool_parser",
    "init_ray",
    "load_config",
    "load_reward_fn",
    "load_tools",
    "make_requests",
    "plot_run",
    "reasoning_gym_rows",
    "register_agent_loop",
    "register_env",
    "resolve_model_config",
    "rollout",
    "scores_to_token_rewards",
    "start_rollout_servers",
    "stop_rollout_servers",
    "tool",
    "verifiers_tools",
]

if TYPE_CHECKING:
    from agentrl.agent_loops.base import AgentLoopBase
    from agentrl.agent_loops.config import RolloutConfig
    from agentrl.agent_loops.conversation import Conversation
    from agentrl.agent_loops.external import ExternalAgentLoop
    from agentrl.agent_loops.external_config import ExternalAgentConfig
    from agentrl.agent_loops.registry import register_agent_loop
    from agentrl.agent_loops.tool_agent import ToolAgentLoop
    from agentrl.algos.advantages import (
        AdvantageInputs,
        compute_advantages,
        scores_to_token_rewards,
    )
    from agentrl.algos.config import AlgorithmConfig
    from agentrl.algos.loss_agg import agg_loss
    from agentrl.algos.policy_losses import get_policy_loss
    from agentrl.algos.rollout_is import compute_rollout_is_weights
    from agentrl.config import AgentRLConfig, ConfigError, load_config
    from agentrl.core.trajectory import AgentLoopOutput, TrajectoryBuilder
    from agentrl.core.types import SamplingParams
    from agentrl.envs.base import StepResult
    from agentrl.envs.loop import EnvAgentLoop
    from agentrl.envs.reasoning_gym import reasoning_gym_rows
    from agentrl.envs.registry import env_factory, register_env
    from agentrl.envs.verifiers import verifiers_tools
    from agentrl.models import resolve_model_config
    from agentrl.plot import plot_run
    from agentrl.reward.config import JudgeConfig
    from agentrl.reward.function import RewardFunction
    from agentrl.reward.judge import RewardJudge
    from agentrl.reward.loader import load_reward_fn
    from agentrl.reward.manager import RewardManager, RewardRequest
    from agentrl.rollout.episode import make_requests
    from agentrl.rollout.metrics import episode_info
    from agentrl.rollout.queue import TrajectoryQueue
    from agentrl.rollout.run import arollout, rollout
    from agentrl.rollout.worker import AgentLoopWorker
    from agentrl.server.gateway.app import build_app as gateway_app
    from agentrl.server.gateway.config import GatewayConfig
    from agentrl.server.gateway.service import GatewayService
    from agentrl.server.gateway.sink import InMemorySink, QueueSink
    from agentrl.server.launch import init_ray, start_rollout_servers, stop_rollout_servers
    from agentrl.server.weight_transport.object_store import ObjectStoreSync
    from agentrl.tools.base import BaseTool, ToolResponse
    from agentrl.tools.decorator import tool
    from agentrl.tools.loader import load_tools
    from agentrl.tools.parsers import get_tool_parser
    from agentrl.tools.reasoning import get_reasoning_parser
    from agentrl.tools.schema import OpenAIFunctionToolSchema


def __getattr__(name: str) -> Any:
    where = _EXPORTS.get(name)
    if where is None:
        raise AttributeError(f"module 'agentrl' has no attribute {name!r}")
    if name == "rollout":
        # The subpackage agentrl.rollout, made callable as rollout(...) (see its
        # __init__): importing any agentrl.rollout.* module sets this attribute to it.
        value = importlib.import_module("agentrl.rollout")
    else:
        module, attribute = where if isinstance(where, tuple) else (where, name)
        value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
