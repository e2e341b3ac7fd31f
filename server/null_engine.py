"""``NullEngine``: a ``RolloutEngine`` that answers at once with fixed tokens (no model).

For benchmarks of the serving and agent-loop layers, for tests of code above the engine,
and for users load-testing their own agent loops (``server.engine.backend=null``). Every
request gets ``engine.null_token_ids`` (cut to ``max_tokens``, the context window and the
first stop token; repeated up to ``max_tokens`` with ``ignore_eos``), each token with log
probability ``NULL_LOGPROB`` and the weight version in force. Pauses hold new requests
until ``resume`` (``abort`` ends the held ones), and ``update_weights`` changes the version
the tokens carry; the tensors themselves are not kept.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

from agentrl.core.config import ModelConfig
from agentrl.core.types import (
    INITIAL_WEIGHT_VERSION,
    PauseMode,
    RolloutError,
    SamplingParams,
    TokenOutput,
)
from agentrl.server.checks import check_prompt, clamp_max_tokens
from agentrl.server.config import EngineConfig
from agentrl.server.engine import NamedTensors, RolloutEngine

logger = logging.getLogger(__name__)

NULL_LOGPROB = -0.5
"""The log probability ``NullEngine`` reports for every token it returns."""


class NullEngine(RolloutEngine):
    """Instant fixed-token generation with the pauses, aborts and versions of a real engine."""

    def __init__(self, model: ModelConfig, engine: EngineConfig) -> None:
        if not engine.null_token_ids:
            raise ValueError("server.engine.null_token_ids is empty: give at least one token id")
        if any(not turn for turn in engine.null_script):
            raise ValueError("server.engine.null_script has an empty turn")
        self._cfg = engine
        self._tokens = list(engine.null_token_ids)
        self._script = [list(turn) for turn in engine.null_script]
        self._version = INITIAL_WEIGHT_VERSION
        self._mode: PauseMode | None = None
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._held: dict[str, asyncio.Future[None]] = {}  # request id -> abort signal
        self._counters = {"requests": 0, "prompt_tokens": 0, "generated_tokens": 0, "aborted": 0}
        self._closed = False
        logger.info("NullEngine ready: %d fixed tokens per response", len(self._tokens))

    @property
    def weight_version(self) -> int:
        """The version set by the last ``update_weights`` (0 at start)."""
        return self._version

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingParams
    ) -> TokenOutput:
        """The fixed response for ``prompt_ids``; waits first while the engine is paused."""
        if self._closed:
            raise RuntimeError("NullEngine is shut down")
        sampling.validate()
        check_prompt(prompt_ids, self._cfg.max_model_len, None)
        if self._mode is not None and not await self._wait_for_resume(request_id):
            self._counters["aborted"] += 1
            return self._output([], "abort", len(prompt_ids))
        limit = clamp_max_tokens(sampling, len(prompt_ids), self._cfg.max_model_len)
        tokens, finish = self._response(self._answer(prompt_ids), sampling, limit)
        self._counters["requests"] += 1
        self._counters["prompt_tokens"] += len(prompt_ids)
        self._counters["generated_tokens"] += len(tokens)
        return self._output(tokens, finish, len(prompt_ids))

    def _answer(self, prompt_ids: list[int]) -> list[int]:
        """``null_token_ids``, or the first script turn not yet in ``prompt_ids``."""
        if not self._script:
            return self._tokens
        position = 0
        for turn in self._script:
            found = _find(prompt_ids, turn, position)
            if found < 0:
                return turn
            position = found + len(turn)
        return self._script[-1]

    @staticmethod
    def _response(answer: list[int], sampling: SamplingParams, limit: int) -> tuple[list[int], str]:
        source = itertools.cycle(answer) if sampling.ignore_eos else iter(answer)
        tokens = list(itertools.islice(source, limit))
        if not sampling.ignore_eos and sampling.stop_token_ids:
            stops = set(sampling.stop_token_ids)
            cut = next((i for i, t in enumerate(tokens) if t in stops), None)
            if cut is not None:
                return tokens[: cut + 1], "stop"
        full = len(tokens) == len(answer) and not sampling.ignore_eos
        return tokens, "stop" if full else "length"

    def _output(self, tokens: list[int], finish: str, num_prompt_tokens: int) -> TokenOutput:
        return TokenOutput(
            token_ids=tokens,
            logprobs=[NULL_LOGPROB] * len(tokens),
            finish_reason=finish,
            num_cached_tokens=0,
            weight_version=self._version,
            token_versions=[self._version] * len(tokens),
            num_prompt_tokens=num_prompt_tokens,
        )

    async def _wait_for_resume(self, request_id: str) -> bool:
        """Hold ``request_id`` until ``resume`` (True) or an abort (False)."""
        if request_id in self._held:
            raise RolloutError(f"request_id {request_id!r} is already in flight")
        aborted = asyncio.get_running_loop().create_future()
        self._held[request_id] = aborted
        resumed = asyncio.ensure_future(self._resumed.wait())
        try:
            await asyncio.wait([resumed, aborted], return_when=asyncio.FIRST_COMPLETED)
            return not aborted.done()
        finally:
            resumed.cancel()
            del self._held[request_id]

    async def abort(self, request_id: str) -> TokenOutput | None:
        """End ``request_id`` if it is held by a pause (empty ``abort`` output), else None.

        A request that is not paused has already finished: there is nothing to abort.
        """
        signal = self._held.get(request_id)
        if signal is None:
            return None
        if not signal.done():
            signal.set_result(None)
        return self._output([], "abort", 0)

    async def pause(self, mode: PauseMode | str = PauseMode.KEEP) -> None:
        """Hold new requests until ``resume``; ``abort`` also ends the requests held now."""
        mode = PauseMode(mode)
        self._mode = mode
        self._resumed.clear()
        if mode is PauseMode.ABORT:
            for signal in self._held.values():
                if not signal.done():
                    signal.set_result(None)

    async def resume(self) -> None:
        """Release the held requests."""
        self._mode = None
        self._resumed.set()

    async def update_weights(self, named_tensors: NamedTensors, version: int) -> None:
        """Tag every later token with ``version`` (the tensors are read and dropped)."""
        for name, _ in named_tensors:
            if not isinstance(name, str):
                raise RolloutError(f"weight names must be strings, got {name!r}")
        self._version = version

    async def reset_prefix_cache(self) -> None:
        """Nothing to drop: the null engine caches nothing."""

    async def stats(self) -> dict[str, Any]:
        """Weight version, pause mode, held requests and request / token counters."""
        return {
            "backend": "null",
            "weight_version": self._version,
            "paused": self._mode.value if self._mode else None,
            "num_running": 0,
            "num_waiting": len(self._held),
            **self._counters,
        }

    async def shutdown(self) -> None:
        """End held requests (``abort``); later calls raise."""
        self._closed = True
        await self.pause(PauseMode.ABORT)


def _find(ids: list[int], part: list[int], start: int) -> int:
    """Where ``part`` first occurs in ``ids`` at or after ``start`` (-1 if nowhere)."""
    first, size = part[0], len(part)
    for at in range(start, len(ids) - size + 1):
        if ids[at] == first and ids[at : at + size] == part:
            return at
    return -1
