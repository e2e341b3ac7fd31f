"""Executing one turn's tool calls: validation, concurrency, timeouts, and error messages.

Every call the model attempted gets exactly one response. Failures become a clear error
message for the model (and an outcome for the metrics); they never end the episode.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from agentrl.tools import BaseTool, FunctionCall, ToolArgumentError
from agentrl.tools.parsers import ParsedTurn

logger = logging.getLogger(__name__)

TRUNCATION_MARKER = "...(truncated)..."


class CallOutcome(StrEnum):
    """How a tool call ended (a metrics label)."""

    OK = "ok"
    MALFORMED = "malformed"
    UNKNOWN_TOOL = "unknown_tool"
    INVALID_ARGUMENTS = "invalid_arguments"
    ERROR = "error"
    TIMEOUT = "timeout"


@dataclass
class CallResult:
    """One tool call's response text and bookkeeping; ``call_id`` is the id the model
    wrote for the call (``FunctionCall.id``), which the result's message names."""

    tool: str
    outcome: CallOutcome
    text: str
    reward: float = 0.0
    seconds: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)
    call_id: str | None = None


def truncate_response(text: str, limit: int, side: str) -> str:
    """Cut ``text`` to at most ``limit`` characters, marking where it was cut."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - len(TRUNCATION_MARKER))
    if side == "left":
        return TRUNCATION_MARKER + text[len(text) - keep :]
    if side == "right":
        return text[:keep] + TRUNCATION_MARKER
    head = keep // 2
    return text[:head] + TRUNCATION_MARKER + text[len(text) - (keep - head) :]


class ToolCallExecutor:
    """Runs the calls of one episode against its tools (one tool instance per episode)."""

    def __init__(self, tools: dict[str, BaseTool], max_parallel: int, timeout_s: float) -> None:
        self._tools = tools
        self._limit = asyncio.Semaphore(max_parallel)
        self._timeout_s = timeout_s
        self._instances: dict[str, str] = {}
        self._create_lock = asyncio.Lock()

    async def run_turn(self, parsed: ParsedTurn) -> list[CallResult]:
        """Responses for every attempted call of the turn: valid calls, then malformed ones."""
        if len(parsed.calls) == 1:  # the common case: no tasks to schedule
            results = [await self._run_call(parsed.calls[0])]
        else:
            results = await asyncio.gather(*(self._run_call(call) for call in parsed.calls))
        for call, result in zip(parsed.calls, results, strict=True):
            result.call_id = call.id
        malformed = [
            CallResult("?", CallOutcome.MALFORMED, f"Error: {error}") for error in parsed.errors
        ]
        return [*results, *malformed]

    async def rewards(self) -> float:
        """Sum of ``calc_reward`` over the tool instances this episode used."""
        total = 0.0
        for name, instance_id in self._instances.items():
            total += await self._tools[name].calc_reward(instance_id)
        return total

    async def release(self) -> None:
        """Release every tool instance created for this episode."""
        for name, instance_id in self._instances.items():
            try:
                await self._tools[name].release(instance_id)
            except Exception:
                logger.exception("releasing tool %s instance %s failed", name, instance_id)
        self._instances.clear()

    async def _instance(self, name: str, tool: BaseTool) -> str:
        async with self._create_lock:
            if name not in self._instances:
                self._instances[name] = await tool.create()
            return self._instances[name]

    async def _run_call(self, call: FunctionCall) -> CallResult:
        tool = self._tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self._tools)) or "none"
            text = f"Error: unknown tool {call.name!r}. Available tools: {known}."
            return CallResult(call.name, CallOutcome.UNKNOWN_TOOL, text)
        try:
            tool.validate_arguments(call.arguments)
        except ToolArgumentError as exc:
            return CallResult(call.name, CallOutcome.INVALID_ARGUMENTS, f"Error: {exc}")
        # The time limit starts once the tool admits the call (a sandbox slot, say): a
        # call queued behind other episodes' calls has not started running yet.
        async with self._limit, tool.admission():
            start = time.perf_counter()
            try:
                async with asyncio.timeout(self._timeout_s):
                    instance_id = await self._instance(call.name, tool)
                    response, reward, metrics = await tool.execute(instance_id, call.arguments)
            except TimeoutError:
                text = f"Error: tool {call.name!r} timed out after {self._timeout_s:g} s."
                return CallResult(
                    call.name, CallOutcome.TIMEOUT, text, seconds=time.perf_counter() - start
                )
            except Exception as exc:
                logger.info("tool %s raised %s: %s", call.name, type(exc).__name__, exc)
                text = f"Error: tool {call.name!r} failed: {type(exc).__name__}: {exc}"
                return CallResult(
                    call.name, CallOutcome.ERROR, text, seconds=time.perf_counter() - start
                )
        return CallResult(
            call.name,
            CallOutcome.OK,
            response.text or "",
            reward=float(reward),
            seconds=time.perf_counter() - start,
            metrics=dict(metrics or {}),
        )
