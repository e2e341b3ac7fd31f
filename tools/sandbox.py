"""Run untrusted Python in a sandboxed subprocess, without blocking the event loop.

``Sandbox.run(code)`` starts the interpreter under the strongest isolation this
machine offers (see ``agentrl.tools.isolation``), feeds the code on stdin, and
enforces wall-clock, CPU-time, address-space, process-count and file-size
limits. Output is captured and capped. On timeout or too much output the whole
process group is killed (and with it the sandbox's pid namespace). Runs across
one worker share a global concurrency limit (``set_max_concurrency``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
import time
import weakref
from asyncio import FIRST_COMPLETED
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from agentrl.tools.isolation import (
    SANDBOX_WORKDIR,
    Isolation,
    IsolationInfo,
    detect_isolation,
    interpreter_binds,
    wrap_command,
)

__all__ = ["Sandbox", "SandboxLimits", "SandboxResult", "sandbox_slot", "set_max_concurrency"]

logger = logging.getLogger(__name__)

_BOOT = (Path(__file__).parent / "_sandbox_boot.py").read_text()
_DRAIN_S = 1.0
_THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")

_max_concurrency = max(1, os.cpu_count() or 1)
_semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


def set_max_concurrency(limit: int) -> None:
    """Cap how many sandboxes run at once in this process (default: the CPU count).

    Applies to runs that start afterwards; runs already in flight are not
    counted against the new limit.
    """
    global _max_concurrency
    if limit < 1:
        raise ValueError(f"max concurrency must be >= 1, got {limit}")
    _max_concurrency = limit
    _semaphores.clear()


def _semaphore() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    if loop not in _semaphores:
        _semaphores[loop] = asyncio.Semaphore(_max_concurrency)
    return _semaphores[loop]


_holding_slot: ContextVar[bool] = ContextVar("agentrl_sandbox_slot", default=False)


@contextlib.asynccontextmanager
async def sandbox_slot() -> AsyncIterator[None]:
    """Hold one of this process's sandbox slots (see ``set_max_concurrency``).

    Sandbox runs inside it use the held slot instead of taking another, so a caller can
    wait for a slot first and start a run's time limit only once it has one.
    """
    if _holding_slot.get():
        yield
        return
    async with _semaphore():
        token = _holding_slot.set(True)
        try:
            yield
        finally:
            _holding_slot.reset(token)


class SandboxLimits(BaseModel):
    """Resource limits for one run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    wall_time_s: float = Field(10.0, gt=0, description="Wall-clock limit, then the run is killed.")
    cpu_time_s: float = Field(
        10.0, gt=0, description="CPU-time limit (RLIMIT_CPU: SIGXCPU, then SIGKILL 1 s later)."
    )
    memory_bytes: int = Field(
        1 << 30, gt=0, description="Address-space limit per process (RLIMIT_AS)."
    )
    max_processes: int = Field(
        16, gt=0, description="Processes and threads at once (RLIMIT_NPROC), the first included."
    )
    max_file_bytes: int = Field(
        16 << 20, ge=0, description="Largest file the code may write (RLIMIT_FSIZE)."
    )
    tmpfs_bytes: int = Field(
        64 << 20, gt=0, description="Size of the private working directory (bubblewrap only)."
    )
    max_output_bytes: int = Field(
        64 << 10,
        gt=0,
        description="Cap on stdout and on stderr; more output kills the run.",
    )


@dataclass(frozen=True)
class SandboxResult:
    """What one run produced.

    Attributes:
        stdout: captured standard output (decoded, at most ``max_output_bytes``).
        stderr: captured standard error, likewise.
        exit_code: the interpreter's exit status; ``None`` when it was killed.
        wall_time_s: seconds from start to exit.
        error: why the run did not finish on its own (timeout, a limit, a
            signal), written for the model to read; ``None`` when it did.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    wall_time_s: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        """The code ran to completion and exited with status 0."""
        return self.error is None and self.exit_code == 0


class Sandbox:
    """Runs Python code in a fresh, isolated interpreter process per call.

    Args:
        limits: resource limits for every run.
        python: the interpreter to run (default: this process's).
        isolation: force a level instead of the strongest available one.
        ro_binds: host directories visible read-only under bubblewrap
            (default: the interpreter's prefixes, so its packages import).
        sandbox_uid: the unprivileged uid the code runs as when we are root.
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        python: str | None = None,
        isolation: Isolation | str | None = None,
        ro_binds: tuple[str, ...] | None = None,
        sandbox_uid: int = 65534,
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.python = python or sys.executable
        self._level = Isolation(isolation) if isolation is not None else None
        self._ro_binds = ro_binds
        self._uid = sandbox_uid
        self._info: IsolationInfo | None = None

    async def isolation(self) -> IsolationInfo:
        """The isolation runs get (probed once per process, off the event loop)."""
        if self._info is None:
            self._info = await asyncio.to_thread(
                detect_isolation, self.python, self._ro_binds, self._uid, self._level
            )
        return self._info

    async def run(self, code: str) -> SandboxResult:
        """Run ``code`` and return its captured output; never raises for what the code does."""
        info = await self.isolation()
        async with sandbox_slot():
            workdir = None
            if info.level is not Isolation.BWRAP:
                workdir = tempfile.mkdtemp(prefix="agentrl-sandbox-")
                if info.run_as_uid is not None:
                    os.chown(workdir, info.run_as_uid, info.run_as_uid)
            try:
                return await self._run(info, code, workdir)
            finally:
                if workdir is not None:
                    await asyncio.to_thread(_remove_tree, workdir)

    async def _run(self, info: IsolationInfo, code: str, workdir: str | None) -> SandboxResult:
        limits = self.limits
        argv = [self.python, "-s", "-B", "-c", _BOOT, json.dumps(self._rlimits(info))]
        ro_binds = interpreter_binds(self.python) if self._ro_binds is None else self._ro_binds
        argv = wrap_command(info, argv, ro_binds=ro_binds, tmpfs_bytes=limits.tmpfs_bytes)
        home = workdir or SANDBOX_WORKDIR
        env = {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LC_ALL": "C.UTF-8"}
        env.update(dict.fromkeys(_THREAD_ENV, "1"))
        overflow = asyncio.Event()
        stdout = _CappedOutput(limits.max_output_bytes, overflow)
        stderr = _CappedOutput(limits.max_output_bytes, overflow)
        # Own pipes and a file for stdin, not asyncio's PIPE: on Python 3.11, Process.wait()
        # also waits for the pipes to close, which a paused reader or a leftover never does.
        async with stdout.pipe() as out_fd, stderr.pipe() as err_fd:
            with tempfile.TemporaryFile() as stdin:
                stdin.write(code.encode(errors="replace"))
                stdin.seek(0)
                start = time.monotonic()
                try:
                    proc = await asyncio.create_subprocess_exec(
                        *argv,
                        stdin=stdin,
                        stdout=out_fd,
                        stderr=err_fd,
                        cwd=workdir or "/",
                        env=env,
                        start_new_session=True,
                    )
                finally:
                    stdout.close_write_end()
                    stderr.close_write_end()
            waiter = asyncio.ensure_future(proc.wait())
            overflowed = asyncio.ensure_future(overflow.wait())
            try:
                await asyncio.wait(
                    [waiter, overflowed], timeout=limits.wall_time_s, return_when=FIRST_COMPLETED
                )
            finally:
                killed_by_us = not waiter.done()
                _kill_group(proc.pid)  # also ends leftovers of a run that exited by itself
                overflowed.cancel()
                returncode = await waiter
            wall = time.monotonic() - start
            with contextlib.suppress(TimeoutError):  # a leftover outside the group holds a pipe
                await asyncio.wait_for(asyncio.gather(stdout.closed, stderr.closed), _DRAIN_S)
        signal_error = None if killed_by_us else self._signal_error(info, returncode)
        if overflow.is_set():
            error = f"output exceeded {limits.max_output_bytes} bytes and was truncated"
            error += "; process killed" if killed_by_us else ""
        elif killed_by_us:
            error = f"timed out after {limits.wall_time_s:g} s (wall-clock limit); process killed"
        else:
            error = signal_error
        return SandboxResult(
            stdout=stdout.text(),
            stderr=stderr.text(),
            exit_code=None if killed_by_us or signal_error else returncode,
            wall_time_s=wall,
            error=error,
        )

    def _rlimits(self, info: IsolationInfo) -> dict[str, list[int]]:
        limits = self.limits
        cpu = max(1, math.ceil(limits.cpu_time_s))
        out = {
            "RLIMIT_CPU": [cpu, cpu + 1],
            "RLIMIT_AS": [limits.memory_bytes] * 2,
            "RLIMIT_FSIZE": [limits.max_file_bytes] * 2,
            "RLIMIT_CORE": [0, 0],
        }
        if info.process_limit != "none":
            out["RLIMIT_NPROC"] = [limits.max_processes] * 2
        return out

    def _signal_error(self, info: IsolationInfo, returncode: int) -> str | None:
        signum = -returncode if returncode < 0 else None
        if info.level is not Isolation.PROCESS and returncode > 128:  # pid 1 reports 128 + signal
            signum = returncode - 128
        if signum is None:
            return None
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        if signum == signal.SIGXCPU:
            return f"CPU-time limit of {self.limits.cpu_time_s:g} s exceeded ({name})"
        if signum == signal.SIGKILL:
            return f"killed by {name} (CPU-time hard limit or out of memory)"
        return f"killed by {name}"


class _CappedOutput(asyncio.Protocol):
    """Reads one output pipe of the child into a buffer of at most ``cap`` bytes."""

    def __init__(self, cap: int, overflow: asyncio.Event) -> None:
        self.cap = cap
        self.overflow = overflow
        self.buf = bytearray()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._write_fd: int | None = None

    @contextlib.asynccontextmanager
    async def pipe(self) -> AsyncIterator[int]:
        """A pipe read by this protocol; yields the write end, to hand to the child.

        Call ``close_write_end`` once the child holds it, or EOF never comes.
        Both ends are closed on exit.
        """
        read_fd, self._write_fd = os.pipe()
        try:
            transport, _ = await asyncio.get_running_loop().connect_read_pipe(
                lambda: self, os.fdopen(read_fd, "rb", buffering=0)
            )
        except BaseException:
            os.close(read_fd)
            self.close_write_end()
            raise
        try:
            yield self._write_fd
        finally:
            self.close_write_end()
            transport.close()

    def close_write_end(self) -> None:
        """Close our copy of the write end (idempotent)."""
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None

    def data_received(self, data: bytes) -> None:
        room = self.cap - len(self.buf)
        self.buf += data[: max(room, 0)]
        if len(data) > room:
            self.overflow.set()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def text(self) -> str:
        """The captured bytes, decoded as UTF-8 (invalid bytes replaced)."""
        return self.buf.decode(errors="replace")


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _remove_tree(path: str) -> None:
    def make_writable_and_retry(func: Callable[[str], object], failed: str, _exc: object) -> None:
        os.chmod(os.path.dirname(failed), 0o700)
        func(failed)

    try:
        shutil.rmtree(path, onerror=make_writable_and_retry)
    except OSError as exc:
        logger.warning("could not remove sandbox directory %s: %s", path, exc)
