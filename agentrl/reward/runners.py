"""Run a blocking reward call off the event loop, with a timeout, in a thread or a process.

Threads: long-lived daemon threads, one call at a time each, started only when none is idle
(a thread per call would cost the driver's event loop a thread start per episode). A call
that times out is abandoned with its thread (Python cannot kill a thread): it keeps running
until it returns, without holding a worker slot, and its thread then ends.

Processes: a ``spawn`` pool. The worker arms ``SIGALRM`` for the timeout, which interrupts
pure-Python work; a call stuck in C code is caught by a guard timeout in the parent, which
retires that pool (new calls go to a fresh one) and terminates it once its other calls
have finished. Each worker first imports the config's plugins that the parent imported
(``agentrl.plugins.import_plugins_from_env``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import multiprocessing
import queue
import signal
import threading
from collections.abc import Callable
from multiprocessing.pool import Pool
from typing import Any

from agentrl.plugins import PluginError, import_plugins_from_env
from agentrl.reward.loader import RewardFnRef

__all__ = ["GUARD_GRACE_S", "POOL_START_S", "ProcessRunner", "ThreadRunner", "call_reward_fn"]

logger = logging.getLogger(__name__)

GUARD_GRACE_S = 5.0
"""Extra seconds the parent waits for a process call past its own timeout."""

POOL_START_S = 60.0
"""Further allowance while a fresh pool has not yet returned anything (workers importing)."""

Target = Callable[..., Any] | RewardFnRef


def call_reward_fn(target: Target, kwargs: dict[str, Any]) -> Any:
    """Call the reward function (resolving a ``RewardFnRef``); run a returned coroutine."""
    fn = target.resolve() if isinstance(target, RewardFnRef) else target
    result = fn(**kwargs)
    if inspect.iscoroutine(result):
        result = asyncio.run(result)
    return result


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _bridge(future: asyncio.Future[Any]) -> tuple[Callable[[Any], None], Callable[[Any], None]]:
    """Callbacks, safe from any thread, that settle ``future`` on its loop."""
    loop = future.get_loop()

    def ok(result: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(_settle, future, result, None)

    def fail(error: BaseException) -> None:
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_settle, future, None, error)

    return ok, fail


class ThreadRunner:
    """Runs blocking calls on daemon threads that outlive them, with a timeout."""

    def __init__(self) -> None:
        self._idle: list[_CallThread] = []

    async def run(self, target: Target, kwargs: dict[str, Any], timeout_s: float) -> Any:
        """The call's result on an idle thread (a new one if none is); raise
        ``TimeoutError`` after ``timeout_s``, the call's own error if it raised."""
        thread = self._idle.pop() if self._idle else _CallThread()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        thread.calls.put((target, kwargs, *_bridge(future)))
        try:
            return await asyncio.wait_for(future, timeout_s)
        finally:
            if future.cancelled():  # timed out or given up: the call may still run
                thread.calls.put(None)
            else:
                self._idle.append(thread)


class _CallThread:
    """A daemon thread that runs the calls put in ``calls`` until it gets None."""

    def __init__(self) -> None:
        self.calls: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        threading.Thread(target=self._serve, daemon=True, name="agentrl-reward").start()

    def _serve(self) -> None:
        while (call := self.calls.get()) is not None:
            target, kwargs, ok, fail = call
            try:
                result = call_reward_fn(target, kwargs)
            except Exception as exc:
                fail(exc)
            except BaseException as exc:  # SystemExit & co. must not escape into the event loop
                fail(RuntimeError(f"{type(exc).__name__}: {exc}"))
            else:
                ok(result)


def _on_alarm(signum: int, frame: Any) -> None:
    raise TimeoutError("reward function timed out")


_plugin_error: PluginError | None = None


def _init_worker() -> None:
    """Pool initializer: import the plugins the parent imported (``$AGENTRL_PLUGINS``), so
    scorers they register (``@register_scorer``) exist here too. A failure is raised by
    every call of this worker (an initializer that raises would be restarted forever)."""
    global _plugin_error
    try:
        import_plugins_from_env()
    except PluginError as exc:
        _plugin_error = exc


def _call_in_worker(target: Target, kwargs: dict[str, Any], timeout_s: float) -> Any:
    if _plugin_error is not None:
        raise _plugin_error
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        return call_reward_fn(target, kwargs)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


class _Generation:
    """One pool, its calls in flight, and whether it is retired (terminated once idle)."""

    def __init__(self, num_workers: int) -> None:
        self.pool: Pool = multiprocessing.get_context("spawn").Pool(
            num_workers, initializer=_init_worker
        )
        self.in_flight = 0
        self.retired = False
        self.started = False

    def finish(self) -> None:
        self.in_flight -= 1
        if self.retired and self.in_flight == 0:
            self.pool.terminate()


class ProcessRunner:
    """A lazily started ``spawn`` process pool for reward calls."""

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self._current: _Generation | None = None

    async def run(self, target: Target, kwargs: dict[str, Any], timeout_s: float) -> Any:
        """Run the call in a worker; raise ``TimeoutError`` after ``timeout_s``."""
        if self._current is None:
            self._current = _Generation(self.num_workers)
        gen = self._current
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        ok, fail = _bridge(future)
        gen.in_flight += 1
        gen.pool.apply_async(
            _call_in_worker, (target, kwargs, timeout_s), callback=ok, error_callback=fail
        )
        guard_s = timeout_s + GUARD_GRACE_S + (0.0 if gen.started else POOL_START_S)
        try:
            return await asyncio.wait_for(future, guard_s)
        except TimeoutError:
            if future.cancelled():  # the guard fired: the worker ignored its own alarm
                self._retire(gen)
            raise
        finally:
            gen.started = gen.started or (future.done() and not future.cancelled())
            gen.finish()

    def _retire(self, gen: _Generation) -> None:
        logger.warning(
            "a reward call ignored its timeout (stuck outside Python?); "
            "replacing the reward process pool"
        )
        gen.retired = True
        if self._current is gen:
            self._current = None

    def close(self) -> None:
        """Terminate the worker processes."""
        if self._current is not None:
            self._current.pool.terminate()
            self._current = None
