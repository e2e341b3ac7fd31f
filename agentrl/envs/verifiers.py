"""``verifiers:TASKSET``: a verifiers (0.4) environment, with agentrl's model as its agent.

``TASKSET`` is what verifiers' own loader takes as a taskset id: a module of the user's
(on ``sys.path``) or an installed package whose ``__all__`` exports one ``vf.Taskset``
subclass (and, for a multi-turn environment, one ``vf.Env`` subclass), or one of the
tasksets bundled with verifiers. What agentrl takes from it:

- the dataset: the taskset's tasks (``load()``), episode ``seed`` picking task
  ``seed % len(tasks)``; a task's ``system_prompt`` and ``prompt`` open the episode;
- the reward: the task's own scoring (its ``@vf.reward`` and ``@vf.metric`` methods and
  the rewards its config plugs in), run by ``Task.score`` over a ``vf.Trace`` of the
  episode when it ends; the weighted sum (``trace.reward``) is the last step's reward,
  the per-reward scores go into the step's info;
- multi-turn control: an ``Env`` subclass's ``run(task, agents)``. The seat the model
  plays (``seat``, default the env's only one) is agentrl's model: each
  ``interaction.turn(message)`` the env makes is a user message to the model, answered
  by the model's next reply, until ``run`` returns;
- tools: the ``@vf.tool`` methods of the taskset's and the task's ``Toolset``s,
  called in this process (named ``<server>_<tool>`` as verifiers names them). The
  model's tool calls (parsed by agentrl's tool-call parser) are executed and answered
  with tool messages; a reply without a call ends the model's segment.
  ``verifiers_tools(TASKSET)`` gives the same tools as agentrl tools, for the worker's
  chat template (``loop_context(..., tools=...)``).

docs/guides/environments.md lists the parts of verifiers that agentrl does not run.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import pkgutil
from collections.abc import AsyncIterator
from typing import Any

import httpx
import verifiers.v1 as vf
from verifiers.v1 import tasksets as bundled_tasksets
from verifiers.v1.agent import Segment
from verifiers.v1.configs.agent import agent_config_fields
from verifiers.v1.graph import MessageNode
from verifiers.v1.trace import AgentInfo, Trace, TraceTask
from verifiers.v1.utils import loaders
from verifiers.v1.utils.decorators import discover_decorated

from agentrl.agent_loops.tool_calls import ToolCallExecutor
from agentrl.envs.base import EnvError, Message, StepResult
from agentrl.envs.registry import UnknownEnvError
from agentrl.tools import BaseTool, FunctionCall, FunctionTool, function_schema
from agentrl.tools.parsers import ParsedTurn

NETWORK_ERRORS = (OSError, httpx.TransportError)
"""Failures of a taskset that reaches for the network (sockets, DNS, HTTP clients)."""


def available_ids() -> list[str]:
    """The tasksets bundled with verifiers (any importable taskset module works too)."""
    return sorted(m.name for m in pkgutil.iter_modules(bundled_tasksets.__path__))


def check_id(env_id: str) -> None:
    """Raise ``UnknownEnvError`` for an id that names no importable taskset module."""
    if "/" in env_id:
        raise UnknownEnvError(
            f"verifiers:{env_id} is a hub id: hub environments cannot be downloaded here; "
            f"install the environment's package (or put its module on the path) and name "
            f"the module: verifiers:{env_id.rsplit('/', 1)[-1].split('@', 1)[0]}"
        )
    try:
        loaders.taskset_class(env_id)
    except (ModuleNotFoundError, AttributeError, TypeError) as exc:
        raise UnknownEnvError(
            f"unknown verifiers taskset {env_id!r}: {exc} Bundled: "
            f"{', '.join(available_ids())}; or a module of yours on the path whose "
            "__all__ exports a vf.Taskset subclass"
        ) from exc


def make(env_id: str, **kwargs: Any) -> VerifiersEnv:
    """The factory behind ``verifiers:TASKSET`` (``kwargs``: see ``VerifiersEnv``)."""
    return VerifiersEnv(env_id, **kwargs)


def _config_key(config: dict[str, Any] | None) -> str:
    return json.dumps(config or {}, sort_keys=True, default=str)


@functools.lru_cache(maxsize=16)
def _loaded(env_id: str, env_json: str, num_tasks: int | None) -> tuple[Any, list[Any]]:
    """(the verifiers ``Env``, its taskset's tasks), made once per process and config."""
    fields = json.loads(env_json)
    config = loaders.resolve_env_config(
        {**fields, "taskset": {**fields.get("taskset", {}), "id": env_id}}
    )
    try:
        env = loaders.load_environment(config)
        if not env.taskset.bounded and num_tasks is None:
            raise EnvError(
                f"verifiers:{env_id} is an infinite taskset: set rollout.env.kwargs.num_tasks"
            )
        tasks = list(env.taskset if num_tasks is None else env.taskset.take(num_tasks))
    except NETWORK_ERRORS as exc:
        raise EnvError(
            f"verifiers:{env_id} needs the network: loading its tasks failed with "
            f"{type(exc).__name__}: {exc} (nothing outside this machine can be reached; use "
            "a taskset whose data ships with it or is on disk)"
        ) from exc
    if not tasks:
        raise EnvError(f"verifiers:{env_id} loaded no tasks")
    return env, tasks


def _toolsets(taskset_cls: type, config: Any, task: Any | None) -> list[Any]:
    """The taskset's toolsets, then the task's (its class's, without a task)."""
    toolsets = list(taskset_cls.toolsets(config.taskset))
    task_cls = taskset_cls.task_type() if task is None else type(task)
    task_config = config.taskset.task if task is None else task.config
    return toolsets + list(task_cls.toolsets(task_config))


def _function_tools(toolsets: list[Any]) -> dict[str, FunctionTool]:
    tools: dict[str, FunctionTool] = {}
    for toolset in toolsets:
        if toolset._state_cls is not vf.State:
            raise EnvError(
                f"verifiers toolset {type(toolset).__name__} keeps a State, which verifiers "
                "syncs over its rollout server's state channel: not supported"
            )
        prefix = toolset.server_name
        for method in discover_decorated(toolset, "tool"):
            name = getattr(method, "tool_name", None) or method.__name__
            full = f"{prefix}_{name}" if prefix else name
            description = (method.__doc__ or "").strip() or None
            tools[full] = FunctionTool(
                method, function_schema(method, name=full, description=description)
            )
    return tools


def verifiers_tools(env_id: str, env: dict[str, Any] | None = None) -> dict[str, BaseTool]:
    """The ``@vf.tool`` methods of taskset ``env_id``'s toolsets (and its task class's) as
    agentrl tools by name, for the chat template of the loop that runs it."""
    check_id(env_id)
    vf_env, _ = _loaded(env_id, _config_key(env), None)
    return dict(_function_tools(_toolsets(type(vf_env.taskset), vf_env.config, None)))


class VerifiersEnv:
    """One episode of a verifiers taskset (a ``TextEnv``).

    ``env``: fields of the verifiers env config (``{"taskset": {...}}`` for the taskset's
    own config, the seats' agent configs, the env's knobs). ``seat``: the agent the model
    plays in a multi-agent ``Env`` (default: the only one). ``num_tasks``: how many tasks
    of an infinite taskset to load. ``max_parallel_calls`` and ``tool_timeout_s``: how
    many of a turn's tool calls run at once, and the time limit of one.
    """

    def __init__(
        self,
        env_id: str,
        *,
        env: dict[str, Any] | None = None,
        seat: str | None = None,
        num_tasks: int | None = None,
        max_parallel_calls: int = 4,
        tool_timeout_s: float = 30.0,
    ) -> None:
        self.env_id = env_id
        self.name = f"verifiers:{env_id}"
        self.vf_env, self.tasks = _loaded(env_id, _config_key(env), num_tasks)
        self.config = self.vf_env.config
        seats = list(agent_config_fields(self.config))
        if seat is None and len(seats) > 1:
            raise EnvError(
                f"{self.name}: {type(self.vf_env).__name__} has seats {seats}; say which one "
                "the model plays (rollout.env.kwargs.seat)"
            )
        self.seat = seat or seats[0]
        if self.seat not in seats:
            raise EnvError(f"{self.name}: no seat {self.seat!r}; seats: {seats}")
        self.tools: dict[str, FunctionTool] = {}
        self.max_parallel_calls = max_parallel_calls
        self.tool_timeout_s = tool_timeout_s
        self.executor = ToolCallExecutor({}, max_parallel_calls, tool_timeout_s)
        self.exchange: Exchange | None = None
        self._asks: asyncio.Queue[list[Message]] = asyncio.Queue()
        self._answer: asyncio.Future[Segment] | None = None
        self._run: asyncio.Task[None] | None = None

    async def reset(
        self, row: dict[str, Any] | None = None, seed: int | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Task ``seed % len(tasks)`` (seed None: the first), run by the env until it
        asks the model for its first turn."""
        index = (seed or 0) % len(self.tasks)
        task = self.tasks[index]
        if task.NEEDS_CONTAINER:
            raise EnvError(
                f"{self.name}: task {type(task).__name__} needs a container runtime, which "
                "agentrl does not start for verifiers tasks"
            )
        if task.config.judges:
            names = [judge.id for judge in task.config.judges]
            raise EnvError(
                f"{self.name} needs the network: its judges {names} call a model through "
                "verifiers' client; score with agentrl's reward.judge instead"
            )
        toolsets = _toolsets(type(self.vf_env.taskset), self.config, task)
        for toolset in toolsets:
            await toolset.setup()
            await toolset.setup_task(task)
        self.tools = _function_tools(toolsets)
        self.executor = ToolCallExecutor(self.tools, self.max_parallel_calls, self.tool_timeout_s)
        self._run = asyncio.create_task(self._play(task))
        messages = await self._next()
        if messages is None:
            raise EnvError(f"{self.name}: the env's run ended before the model's first turn")
        return messages, {"task_index": index}

    async def _play(self, task: Any) -> None:
        agents = vf.Agents(self.config, make=self._agent)
        await self.vf_env.setup(agents)
        await self.vf_env.run(task, agents)

    def _agent(self, name: str, config: Any) -> Seat:
        return Seat(self, name, config, played=name == self.seat)

    async def ask(self, messages: list[Message]) -> Segment:
        """The model's answer to ``messages`` (what an env's ``turn`` waits on)."""
        self._answer = asyncio.get_running_loop().create_future()
        self._asks.put_nowait(messages)
        return await self._answer

    async def _next(self) -> list[Message] | None:
        """The env's next request to the model, or None when its run is over (whatever
        the run raised is raised here)."""
        assert self._run is not None
        get = asyncio.ensure_future(self._asks.get())
        try:
            await asyncio.wait({get, self._run}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not get.done():
                get.cancel()
        if get.done() and not get.cancelled():
            return get.result()
        self._run.result()
        return None

    async def step(self, message: Message) -> StepResult:
        """Tool calls: executed, answered with tool messages. A reply: handed to the env;
        its next turn's message, or, when its run is over, the task's score."""
        exchange = self.exchange
        if exchange is None or self._answer is None:
            raise EnvError(f"{self.name}: step before reset")
        calls = message.get("tool_calls") or []
        errors = message.get("tool_call_errors") or []
        exchange.add(_assistant_message(message), sampled=True)
        if calls or errors:
            return StepResult(await self._run_calls(exchange, calls, errors), 0.0)
        exchange.end_segment()
        messages = await self._next()
        if messages is not None:
            return StepResult(messages, 0.0)
        trace = exchange.trace()
        await exchange.task.score(trace)
        info = {
            "rewards": {k: None if r is None else r.score for k, r in trace.rewards.items()},
            "metrics": dict(trace.metrics),
        }
        return StepResult([], trace.reward, terminated=True, info=info)

    async def _run_calls(
        self, exchange: Exchange, calls: list[dict[str, Any]], errors: list[str]
    ) -> list[Message]:
        """The tool messages answering a turn's calls: each valid call's result (or its
        error), then an error for each malformed one, as the ``tool_agent`` loop answers."""
        parsed = ParsedTurn(
            "",
            [
                FunctionCall(
                    name=call["function"]["name"],
                    arguments=call["function"]["arguments"],
                    id=call["id"],
                )
                for call in calls
            ],
            list(errors),
        )
        messages = []
        for i, result in enumerate(await self.executor.run_turn(parsed)):
            call_id = result.call_id or f"malformed_{i}"
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "name": result.tool,
                    "content": result.text,
                }
            )
            exchange.add(
                vf.ToolMessage(tool_call_id=call_id, name=result.tool, content=result.text)
            )
        return messages

    async def close(self) -> None:
        """Stop the env's run if the episode ended before it did; release the tools."""
        if self._run is not None and not self._run.done():
            self._run.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._run
        await self.executor.release()


class Seat:
    """An agent seat of the env: the one agentrl's model plays answers through the
    episode; any other seat raises (agentrl runs one model seat per episode)."""

    def __init__(self, env: VerifiersEnv, name: str, config: Any, played: bool) -> None:
        self.env = env
        self.name = name
        self.config = config
        self.played = played
        self.trainable = True

    async def run(self, task: Any, **_: Any) -> Trace:
        """The model answers the task (the single-agent case)."""
        async with self.interaction(task) as exchange:
            await exchange.turn()
        return exchange.trace()

    @contextlib.asynccontextmanager
    async def interaction(self, task: Any, **_: Any) -> AsyncIterator[Exchange]:
        """Turn-by-turn exchange with the model on ``task``."""
        if not self.played:
            raise EnvError(
                f"{self.env.name}: the env runs seat {self.name!r}, which needs a model of "
                f"its own; agentrl's model plays seat {self.env.seat!r} only"
            )
        exchange = Exchange(self.env, task)
        self.env.exchange = exchange
        yield exchange


class Exchange:
    """The model's side of an ``interaction``: ``turn(message)`` returns the model's
    reply as a ``Segment``; the messages so far make the trace its rewards score."""

    def __init__(self, env: VerifiersEnv, task: Any) -> None:
        self.env = env
        self.task = task
        self.nodes: list[MessageNode] = []
        self._segment: list[Any] = []
        self._opened = False

    async def turn(self, message: str | list[Any] | None = None) -> Segment:
        """Send ``message`` (for a prompted task's first turn, after its prompt)."""
        messages: list[Message] = []
        if not self._opened:
            self._opened = True
            data = self.task.data
            if data.system_prompt:
                messages.append({"role": "system", "content": data.system_prompt})
            messages += _chat(data.prompt)
        messages += _chat(message)
        if not messages:
            raise EnvError(f"{self.env.name}: a turn with no message for the model")
        for chat_message in messages:
            model = vf.SystemMessage if chat_message["role"] == "system" else vf.UserMessage
            self.add(model(content=chat_message["content"]))
        self._segment = []
        return await self.env.ask(messages)

    def add(self, message: Any, sampled: bool = False) -> None:
        parent = len(self.nodes) - 1 if self.nodes else None
        self.nodes.append(MessageNode(parent=parent, message=message, sampled=sampled))
        if sampled or isinstance(message, vf.ToolMessage):
            self._segment.append(message)

    def end_segment(self) -> None:
        """The model's reply is complete: the env's waiting ``turn`` returns it."""
        answer = self.env._answer
        if answer is not None and not answer.done():
            answer.set_result(Segment(messages=list(self._segment)))

    def trace(self) -> Trace:
        """The exchange as a verifiers trace of this task."""
        return Trace(
            task=TraceTask(type=type(self.task).__name__, data=self.task.data),
            agent=AgentInfo(config=vf.AgentConfig()),
            nodes=list(self.nodes),
            is_completed=True,
        )


def _chat(message: str | list[Any] | None) -> list[Message]:
    if message is None:
        return []
    if isinstance(message, str):
        return [{"role": "user", "content": message}]
    out = []
    for item in message:
        data = item.model_dump() if hasattr(item, "model_dump") else dict(item)
        content = data.get("content")
        if not isinstance(content, str):
            raise EnvError(
                f"verifiers message of role {data.get('role')!r} has non-text content, "
                "which agentrl does not render"
            )
        out.append({"role": data["role"], "content": content})
    return out


def _assistant_message(message: Message) -> Any:
    calls = [
        vf.ToolCall(
            id=call["id"],
            name=call["function"]["name"],
            arguments=json.dumps(call["function"]["arguments"]),
        )
        for call in message.get("tool_calls") or []
    ]
    return vf.AssistantMessage(content=message.get("content") or "", tool_calls=calls or None)
