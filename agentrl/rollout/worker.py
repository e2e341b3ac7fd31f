"""``AgentLoopWorker``: runs many agent loops concurrently on one event loop.

Used in-process (tests, benchmarks) or as a Ray actor by ``AgentLoopManager``; Ray runs
async actors on uvloop when it is installed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from pydantic import Field
from transformers import AutoTokenizer

from agentrl.agent_loops.base import AgentLoopContext, GenerateClient
from agentrl.agent_loops.chat import ChatRenderer
from agentrl.agent_loops.config import RolloutConfig
from agentrl.agent_loops.registry import get_agent_loop
from agentrl.core.config import ModelConfig, Section
from agentrl.models import generation_stop_tokens, resolve_model_config
from agentrl.plugins import import_plugins
from agentrl.rollout.deadlines import EpisodeDeadlines, EpisodeTimeout
from agentrl.rollout.episode import EpisodeRequest, EpisodeResult
from agentrl.rollout.episode_batches import EpisodeStreamer
from agentrl.server.config import ServerConfig
from agentrl.tools import BaseTool
from agentrl.tools.parsers import ToolCallParser, get_tool_parser
from agentrl.tools.reasoning import get_reasoning_parser
from agentrl.tools.render import place_tools, tools_for_chat_template

logger = logging.getLogger(__name__)


class AgentLoopWorkerConfig(Section):
    """The sections of the config tree an agent-loop worker reads. A worker is handed
    these alone, so its process loads no trainer or algorithm config (or code)."""

    plugins: list[str] = Field(
        default_factory=list, description="Plugin modules to import (see `plugins`)."
    )
    model: ModelConfig = Field(default_factory=ModelConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)

    @classmethod
    def of(cls, config: Any) -> AgentLoopWorkerConfig:
        """The worker's sections of ``config``: a full ``AgentRLConfig``, its dict, or
        already an ``AgentLoopWorkerConfig``."""
        if isinstance(config, cls):
            return config
        if isinstance(config, dict):
            return cls.model_validate({k: config[k] for k in cls.model_fields if k in config})
        return cls.model_validate({k: getattr(config, k) for k in cls.model_fields})

    def resolved(self) -> AgentLoopWorkerConfig:
        """A copy ready to run in any process: ``builtin:`` model names resolved to
        checkpoint directories, and the plugins imported (file paths made absolute), as
        ``agentrl.config.resolve_user_config`` does for the full config."""
        return self.model_copy(
            update={
                "model": resolve_model_config(self.model),
                "plugins": import_plugins(self.plugins),
            }
        )


class AgentLoopWorker(EpisodeStreamer):
    """Holds the tokenizer, tools and server client shared by its episodes; runs one
    (``run_episode``) or a batch whose results stream back (``run_episodes``)."""

    def __init__(
        self,
        config: AgentLoopWorkerConfig | Any,
        client: GenerateClient | None = None,
        tools: dict[str, BaseTool] | None = None,
        tokenizer: Any = None,
    ) -> None:
        """``config``: the worker's sections, or a full config (``AgentRLConfig`` or its
        dict) to take them from."""
        self.config = AgentLoopWorkerConfig.of(config)
        # Before anything resolves a registered name (loops, tool parsers, tools).
        import_plugins(self.config.plugins)
        rollout = self.config.rollout
        model = resolve_model_config(self.config.model)  # builtin: names, as the CLI takes
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(model.tokenizer)
        self.client = client or self._connect()
        self.tools = tools if tools is not None else self._load_tools()
        template_tools, system_prompt = place_tools(
            self.tokenizer,
            self.tools,
            rollout.tools_in_system_prompt,
            rollout.tools_prompt_template,
        )
        schemas = tools_for_chat_template(self.tools)
        parser = get_tool_parser(rollout.tool_parser, self.tokenizer, schemas)
        self.renderer = ChatRenderer(
            self.tokenizer,
            template_tools,
            system_prompt,
            fast_path=rollout.template_cache,
            stop_tokens=(
                *parser.end_of_turn_tokens,
                *generation_stop_tokens(model.path, self.tokenizer),
            ),
        )
        self._parser_factory: Callable[[], ToolCallParser] = (
            (lambda: parser)
            if parser.stateless
            else (lambda: get_tool_parser(rollout.tool_parser, self.tokenizer, schemas))
        )
        # Stateless on finished turns: one per worker serves every episode.
        self._reasoning_parser = get_reasoning_parser(rollout.reasoning_parser, self.tokenizer)
        self._slots = asyncio.Semaphore(rollout.max_concurrent_loops)
        self._deadlines = EpisodeDeadlines(rollout.loop_timeout_s)

    def _connect(self) -> GenerateClient:
        from agentrl.server.client import DataClient

        return DataClient.from_config(self.config.server)

    def _load_tools(self) -> dict[str, BaseTool]:
        path = self.config.rollout.tool_config_path
        if not path:
            return {}
        from agentrl.tools import load_tools

        return load_tools(path)

    async def run_episode(self, request: EpisodeRequest) -> EpisodeResult:
        """Run one episode; a loop that raises or times out becomes a failed result."""
        agent_name = request.row.get("agent_name") or self.config.rollout.agent_name
        result = EpisodeResult(
            request.episode_id,
            request.group_id,
            request.row_index,
            request.sample_index,
            agent_name,
        )
        async with self._slots:
            start = time.perf_counter()
            try:
                context = self._context(request.episode_id)
                loop = get_agent_loop(agent_name)(context)
                outputs = await self._deadlines.run(loop.run(request.row, request.sampling))
                result.outputs = outputs if isinstance(outputs, list) else [outputs]
                for output in result.outputs:
                    output.metrics.update(context.metrics)
            except EpisodeTimeout:
                result.error = f"episode timed out after {self.config.rollout.loop_timeout_s:g} s"
            except Exception as exc:
                logger.exception("episode %s (%s) failed", request.episode_id, agent_name)
                result.error = f"{type(exc).__name__}: {exc}"
            result.latency_s = time.perf_counter() - start
        return result

    def _context(self, session_id: str) -> AgentLoopContext:
        return AgentLoopContext(
            client=self.client,
            tokenizer=self.tokenizer,
            renderer=self.renderer,
            tools=self.tools,
            tool_parser=self._parser_factory(),
            config=self.config.rollout,
            session_id=session_id,
            reasoning_parser=self._reasoning_parser,
        )

    async def ping(self) -> None:
        """Answers once the worker runs (how the manager sees that Ray restarted it)."""

    async def event_loop_name(self) -> str:
        """The event loop implementation running this worker (uvloop under Ray)."""
        return type(asyncio.get_running_loop()).__module__
