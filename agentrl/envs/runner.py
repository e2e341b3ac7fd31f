"""``EnvRunner``: one episode's environment behind time limits and result checks.

Every call (``reset``, ``step``, ``close``) has the same time limit. Async methods are
awaited under it; plain methods run in a thread of the environments' pool (or inline, when
asked), so a step that hangs ends its episode with an ``EnvError`` instead of holding the
worker. Whatever an environment raises or returns malformed also becomes an ``EnvError``
that names the environment and the step.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agentrl.envs.base import EnvError, Message, StepResult, check_reset, check_step

logger = logging.getLogger(__name__)

ENV_THREADS = 32
"""Threads that run plain-method environments, per process. A step that never returns
keeps its thread; its episode has already failed with a timeout."""

_POOL = ThreadPoolExecutor(max_workers=ENV_THREADS, thread_name_prefix="env")


class EnvRunner:
    """Calls ``env`` for one episode. ``name`` (its source) is what errors call it.

    ``steps`` and ``step_time_s`` count the steps made and the time they took (the
    environment's own time, as the loop sees it: thread hand-off included).
    """

    def __init__(self, env: Any, name: str, timeout_s: float, sync_in_thread: bool = True) -> None:
        for method in ("reset", "step"):
            if not callable(getattr(env, method, None)):
                raise EnvError(
                    f"env {name} made a {type(env).__name__}, which has no {method}() method "
                    "(a TextEnv has async reset(row, seed) and step(message))"
                )
        self.env = env
        self.name = name
        self.timeout_s = timeout_s
        self.sync_in_thread = sync_in_thread
        self.steps = 0
        self.step_time_s = 0.0
        self._hung = False

    async def reset(
        self, row: dict[str, Any] | None = None, seed: int | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """The episode's first messages and info, checked."""
        what = f"env {self.name} reset"
        return check_reset(await self._call(what, self.env.reset, row=row, seed=seed), what)

    async def step(self, message: Message) -> StepResult:
        """The environment's answer to the model's turn ``message``, checked."""
        self.steps += 1
        what = f"env {self.name} step {self.steps}"
        start = time.perf_counter()
        result = await self._call(what, self.env.step, message)
        self.step_time_s += time.perf_counter() - start
        return check_step(result, what)

    async def close(self) -> None:
        """Call the environment's ``close()`` if it has one and is not stuck in a call; a
        failure to close is logged, not raised (the episode's data is complete)."""
        close = getattr(self.env, "close", None)
        if close is None or self._hung:
            return
        try:
            await self._call(f"env {self.name} close", close)
        except EnvError as exc:
            logger.warning("%s", exc)

    async def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            if inspect.iscoroutinefunction(fn):
                return await self._limit(what, fn(*args, **kwargs))
            result = (
                await self._in_thread(what, fn, args, kwargs)
                if self.sync_in_thread
                else (fn(*args, **kwargs))
            )
            return await self._limit(what, result) if inspect.isawaitable(result) else result
        except EnvError:
            raise
        except Exception as exc:
            raise EnvError(f"{what} raised {type(exc).__name__}: {exc}") from exc

    async def _limit(self, what: str, awaitable: Any) -> Any:
        try:
            return await asyncio.wait_for(awaitable, self.timeout_s)
        except TimeoutError:
            raise EnvError(f"{what} timed out after {self.timeout_s:g} s") from None

    async def _in_thread(
        self, what: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        state = {"started": False, "returned": False}

        def run() -> Any:
            state["started"] = True
            try:
                return fn(*args, **kwargs)
            finally:
                state["returned"] = True

        call = functools.partial(contextvars.copy_context().run, run)
        future = asyncio.get_running_loop().run_in_executor(_POOL, call)
        try:
            return await asyncio.wait_for(future, self.timeout_s)
        except TimeoutError:
            if not state["started"]:
                raise EnvError(
                    f"{what} waited {self.timeout_s:g} s for a free environment thread (all "
                    f"{ENV_THREADS} are busy, some perhaps with hung steps)"
                ) from None
            # The thread is still in the call and cannot be stopped: leave the env alone.
            self._hung = not state["returned"]
            raise EnvError(f"{what} timed out after {self.timeout_s:g} s") from None
