"""``SimEngine``: a ``RolloutEngine`` whose time comes from a model of a GPU engine.

``server.engine.backend=sim``. No model runs: a scheduler task per engine replays what a
vLLM-style engine would do on the GPU of ``server.engine.sim.profile`` and sleeps for the
modeled duration (times ``sim.time_scale``), so many replicas fit on a few CPU cores.

Each step, like vLLM's V1 scheduler: running sequences are scheduled first, each with the
tokens it still has to compute (one while decoding, a chunk while prefilling), within the
``sim.max_num_batched_tokens`` budget; when the KV cache has no free block for them, the
youngest running sequence is preempted (its blocks freed, recomputed later). Without a
preemption, waiting requests are admitted while blocks, budget and
``engine.max_num_seqs`` allow, each computing only the prompt tokens the prefix cache
does not hold. Full KV blocks are keyed by a chain hash of their tokens; freed blocks stay
cached, evicted least recently freed first. The step lasts ``SimProfile.step_time`` of its
tokens. Runs of pure decode steps are planned and slept through at once (cut short at the
next step boundary when a request arrives, is aborted, or the engine pauses), so an
engine wakes per event, not per token.

Response lengths are drawn per request from a seeded lognormal (``sim.response_length_*``)
or a recorded trace (``sim.length_trace``), cut to ``max_tokens`` and the context window.
Tokens are ``sim.token_ids`` cycled, ending with the stop id when the drawn length ends
first (finish ``stop``, else ``length``); each has log probability ``NULL_LOGPROB`` and
the weight version of the step that sampled it. Pauses, aborts, versions and
``reset_prefix_cache`` (which, like ``VLLMEngine``'s, preempts running sequences so they
recompute under the new weights) follow the ``RolloutEngine`` contract.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import json
import logging
import math
import random
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
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
from agentrl.server.config import EngineConfig, SimConfig
from agentrl.server.engine import NamedTensors, RolloutEngine
from agentrl.server.null_engine import NULL_LOGPROB
from agentrl.server.sim_profiles import SimProfile, get_profile

logger = logging.getLogger(__name__)

NORMAL_P99 = 2.3263478740408408
"""The 99th percentile of the standard normal: sigma = ln(p99 / median) / NORMAL_P99."""

MAX_DECODE_RUN = 512
"""Most pure-decode steps planned (and slept through) at once."""

_COUNTERS = (
    "requests",
    "aborted",
    "prompt_tokens",
    "cached_prompt_tokens",
    "generated_tokens",
    "computed_tokens",
    "preemptions",
    "reset_preemptions",
    "steps",
)


class LengthSampler:
    """Response lengths: a lognormal from its median and p99, or draws from a trace."""

    def __init__(self, median: int, p99: int, trace: list[int] | None = None) -> None:
        self.trace = trace
        self.mu = math.log(median)
        self.sigma = math.log(p99 / median) / NORMAL_P99

    @classmethod
    def from_config(cls, sim: SimConfig, max_model_len: int) -> LengthSampler:
        """The sampler ``sim`` describes (its trace read and checked against the window)."""
        trace = None
        if sim.length_trace is not None:
            trace = load_length_trace(sim.length_trace, max_model_len)
        return cls(sim.response_length_median, sim.response_length_p99, trace)

    def draw(self, rng: random.Random) -> int:
        """One response length in tokens (at least 1)."""
        if self.trace is not None:
            return rng.choice(self.trace)
        return max(1, round(rng.lognormvariate(self.mu, self.sigma)))


def load_length_trace(path: str, max_model_len: int) -> list[int]:
    """The lengths of a JSON list or a JSONL file (ints or objects with ``length``).

    Raises ValueError naming the file and entry for a missing file, a bad entry, or a
    length a request could not have within ``max_model_len``.
    """
    where = f"server.engine.sim.length_trace={path!r}"
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"{where} cannot be read: {exc}") from exc
    try:
        entries = json.loads(text)
        if not isinstance(entries, list):
            entries = [entries]
    except json.JSONDecodeError:
        try:
            entries = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where} is neither JSON nor JSONL: {exc}") from exc
    longest = max_model_len - 1  # a request has at least one prompt token
    lengths = []
    for i, entry in enumerate(entries):
        value = entry.get("length") if isinstance(entry, dict) else entry
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{where}: entry {i} ({entry!r}) is not a positive length")
        if value > longest:
            raise ValueError(
                f"{where}: entry {i} is {value} tokens, more than the {longest} "
                f"max_model_len={max_model_len} leaves a response"
            )
        lengths.append(value)
    if not lengths:
        raise ValueError(f"{where} holds no lengths")
    return lengths


class BlockPool:
    """Paged KV-cache blocks with a prefix cache, as vLLM keeps them.

    A full block computed under the current weights is registered under the chain hash
    of its tokens. Blocks no sequence holds are free; a free block keeps its hash (a
    later request may hit it) until it is reused, least recently freed first.
    """

    def __init__(self, num_blocks: int, caching: bool) -> None:
        self.num_blocks = num_blocks
        self._caching = caching
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._refs = [0] * num_blocks
        self._hash_of: dict[int, int] = {}
        self._by_hash: dict[int, int] = {}

    @property
    def num_free(self) -> int:
        """Blocks no sequence holds (cached or not)."""
        return len(self._free)

    def cached_prefix(self, hashes: Iterable[int]) -> list[int]:
        """The cached blocks of the longest prefix of ``hashes``."""
        blocks = []
        for h in hashes:
            block = self._by_hash.get(h)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def free_among(self, blocks: list[int]) -> int:
        """How many of ``blocks`` are free (taking them leaves fewer to allocate)."""
        return sum(1 for b in blocks if self._refs[b] == 0)

    def take(self, blocks: list[int]) -> None:
        """Hold cached ``blocks`` (a prefix hit)."""
        for b in blocks:
            if self._refs[b] == 0:
                del self._free[b]
            self._refs[b] += 1

    def allocate(self, n: int) -> list[int]:
        """``n`` fresh blocks (the caller checked ``n <= num_free``), evicting their hashes."""
        blocks = []
        for _ in range(n):
            b, _ = self._free.popitem(last=False)
            h = self._hash_of.pop(b, None)
            if h is not None:
                del self._by_hash[h]
            self._refs[b] = 1
            blocks.append(b)
        return blocks

    def release(self, blocks: list[int]) -> None:
        """Drop a sequence's hold; in reverse, so its tail is evicted before its head."""
        for b in reversed(blocks):
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self._free[b] = None

    def register(self, block: int, block_hash: int) -> None:
        """Cache a full computed block (the first block with a hash keeps it)."""
        if self._caching and block_hash not in self._by_hash:
            self._by_hash[block_hash] = block
            self._hash_of[block] = block_hash

    def reset(self) -> None:
        """Forget every cached hash (held blocks stay held)."""
        self._by_hash.clear()
        self._hash_of.clear()


@dataclass(eq=False)
class _Seq:
    """One request: its tokens (the response's are known in advance) and its KV state."""

    request_id: str
    prompt: list[int]
    target: int
    """Response tokens it will have."""
    stops: bool
    """Whether the last of them is ``end_token`` (finish ``stop``) rather than the limit."""
    end_token: int
    filler: list[int]
    future: asyncio.Future[TokenOutput]
    arrival: float
    """Modeled seconds at arrival."""
    wall_arrival: float
    num_tokens: int = 0
    """Prompt plus response tokens so far."""
    num_output: int = 0
    num_computed: int = 0
    """Tokens whose KV is computed (prompt first, then the response)."""
    num_cached: int | None = None
    """Prompt tokens the first admission found in the prefix cache."""
    num_registered: int = 0
    """Leading blocks registered in the prefix cache."""
    blocks: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    """(first response index, weight version) of each run of tokens one version sampled."""

    def __post_init__(self) -> None:
        self.num_tokens = len(self.prompt)

    def response(self, start: int, end: int) -> list[int]:
        """Response tokens ``start:end``: the filler cycled, the last one ``end_token``
        when the response stops."""
        m = len(self.filler)
        offset = start % m
        tokens = (self.filler * ((end - start) // m + 2))[offset : offset + end - start]
        if self.stops and start < self.target <= end:
            tokens[self.target - 1 - start] = self.end_token
        return tokens

    def block_hashes(self, n: int, block_size: int) -> list[int]:
        """Chain hashes of the first ``n`` full blocks of prompt + response."""
        prompt_len = len(self.prompt)
        for idx in range(len(self.hashes), n):
            start, end = idx * block_size, (idx + 1) * block_size
            tokens = self.prompt[start:end]
            if end > prompt_len:
                tokens += self.response(max(start, prompt_len) - prompt_len, end - prompt_len)
            parent = self.hashes[idx - 1] if idx else 0
            self.hashes.append(hash((parent, *tokens)))
        return self.hashes[:n]

    def sample(self, count: int, version: int) -> None:
        """Record ``count`` new response tokens sampled under ``version``."""
        if not self.spans or self.spans[-1][1] != version:
            self.spans.append((self.num_output, version))
        self.num_output += count
        self.num_tokens += count


@dataclass
class _Step:
    """Planned GPU work: ``work`` for one step, or a run of pure decode steps."""

    work: list[tuple[_Seq, int]]
    """Each scheduled sequence and the tokens it computes (in a decode run: per step)."""
    durations: list[float]
    """Modeled seconds of each step."""
    version: int

    @property
    def is_decode_run(self) -> bool:
        return len(self.durations) > 1


class SimEngine(RolloutEngine):
    """A modeled GPU engine: continuous batching, paged KV cache, prefix cache, preemption."""

    def __init__(self, model: ModelConfig, engine: EngineConfig) -> None:
        sim = engine.sim
        self._cfg = engine
        self.profile: SimProfile = get_profile(sim.profile).with_overrides(sim.profile_overrides)
        self._lengths = LengthSampler.from_config(sim, engine.max_model_len)
        self._block_size = engine.block_size
        self._pool = BlockPool(
            sim.kv_tokens(engine.gpu_memory_utilization) // engine.block_size,
            engine.enable_prefix_caching,
        )
        self._scale = sim.time_scale
        self._rng = random.Random(engine.seed)
        self._running: list[_Seq] = []  # admission order: the last is preempted first
        self._waiting: deque[_Seq] = deque()
        self._held: list[_Seq] = []  # arrived while paused
        self._requests: dict[str, _Seq] = {}
        self._aborting: set[_Seq] = set()  # to end at the next step boundary
        self._mode: PauseMode | None = None
        self._version = INITIAL_WEIGHT_VERSION
        self._counters = dict.fromkeys(_COUNTERS, 0)
        self._busy_s = 0.0
        self._idle_s = 0.0
        self._idle_since: float | None = time.monotonic()  # None while steps run
        self._max_lag_s = 0.0
        self._t0 = time.monotonic()
        self._lock = asyncio.Lock()  # held by a step from plan to apply, and by control ops
        self._wakeup = asyncio.Event()
        self._progress = asyncio.Event()
        self._interrupt: asyncio.Future[None] | None = None
        self._last_end: float | None = None  # loop time the last step was planned to end
        self._scheduler: asyncio.Task[None] | None = None
        self._closed = False
        logger.info(
            "SimEngine ready: profile %s, %d KV blocks of %d tokens, time scale %g",
            self.profile.name,
            self._pool.num_blocks,
            self._block_size,
            self._scale,
        )

    @property
    def weight_version(self) -> int:
        """The version set by the last ``update_weights`` (0 at start)."""
        return self._version

    # -- RolloutEngine API -------------------------------------------------------------------

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingParams
    ) -> TokenOutput:
        """The simulated response to ``prompt_ids``, once the modeled GPU produced it."""
        if self._closed:
            raise RuntimeError("SimEngine is shut down")
        if request_id in self._requests:
            raise RolloutError(f"request_id {request_id!r} is already in flight")
        sampling.validate()
        check_prompt(prompt_ids, self._cfg.max_model_len, None)
        seq = self._new_seq(request_id, list(prompt_ids), sampling)
        self._requests[request_id] = seq
        (self._held if self._mode is not None else self._waiting).append(seq)
        self._kick()
        try:
            return await asyncio.shield(seq.future)
        except asyncio.CancelledError:
            self._aborting.add(seq)
            self._kick()
            raise
        finally:
            if self._requests.get(request_id) is seq:
                del self._requests[request_id]

    async def abort(self, request_id: str) -> TokenOutput | None:
        """End ``request_id`` at the next step boundary; its partial output, or None."""
        seq = self._requests.get(request_id)
        if seq is None:
            return None
        self._aborting.add(seq)
        self._kick()
        return await asyncio.shield(seq.future)

    async def pause(self, mode: PauseMode | str = PauseMode.KEEP) -> None:
        """Stop scheduling at the next step boundary; see ``PauseMode``.

        Requests arriving while paused are held until ``resume``. ``wait`` returns once
        the requests that arrived before it finished; ``abort`` ends them now.
        """
        mode = PauseMode(mode)
        self._mode = mode
        if mode is PauseMode.ABORT:
            self._aborting.update(self._requests.values())
        self._kick()
        if mode is PauseMode.WAIT:
            await self._wait_until(lambda: not self._running and not self._waiting)
            return
        async with self._lock:  # the step under way completes first
            self._reap()
        self._signal()

    async def resume(self) -> None:
        """Continue after ``pause``; held requests queue for admission."""
        self._mode = None
        self._waiting.extend(self._held)
        self._held.clear()
        self._kick()

    async def update_weights(self, named_tensors: NamedTensors, version: int) -> None:
        """Tag tokens of every later step with ``version`` (the tensors are read and dropped)."""
        for name, _ in named_tensors:
            if not isinstance(name, str):
                raise RolloutError(f"weight names must be strings, got {name!r}")
        self._kick()
        async with self._lock:
            self._version = version

    async def reset_prefix_cache(self) -> None:
        """Forget every cached block; running sequences recompute (as vLLM's reset does)."""
        self._kick()
        async with self._lock:
            while self._running:
                self._preempt(self._running.pop())
                self._counters["reset_preemptions"] += 1
            self._pool.reset()
        self._kick()

    async def stats(self) -> dict[str, Any]:
        """Queue sizes, token and cache counters, KV usage and the modeled busy/idle time."""
        c = self._counters
        modeled = self._now()
        used = self._pool.num_blocks - self._pool.num_free
        return {
            "backend": "sim",
            "profile": self.profile.name,
            "weight_version": self._version,
            "paused": self._mode.value if self._mode else None,
            "num_running": len(self._running),
            "num_waiting": len(self._waiting) + len(self._held),
            **c,
            "prefix_cache_hit_rate": c["cached_prompt_tokens"] / c["prompt_tokens"]
            if c["prompt_tokens"]
            else 0.0,
            "kv_cache_blocks": self._pool.num_blocks,
            "kv_cache_usage": used / self._pool.num_blocks,
            "busy_s": self._busy_s,
            "idle_s": self._idle_s + self._idle_now(),
            "modeled_s": modeled,
            "max_lag_s": self._max_lag_s,
            "time_scale": self._scale,
        }

    async def shutdown(self) -> None:
        """End every request (``abort``) and stop the scheduler; later generates raise."""
        if self._closed:
            return
        self._closed = True
        self._aborting.update(self._requests.values())
        self._kick()
        async with self._lock:
            self._reap()
            if self._scheduler is not None:
                self._scheduler.cancel()
        self._signal()

    # -- request intake ----------------------------------------------------------------------

    def _new_seq(self, request_id: str, prompt: list[int], sampling: SamplingParams) -> _Seq:
        limit = clamp_max_tokens(sampling, len(prompt), self._cfg.max_model_len)
        rng = random.Random(sampling.seed) if sampling.seed is not None else self._rng
        length = limit + 1 if sampling.ignore_eos else self._lengths.draw(rng)
        sim = self._cfg.sim
        return _Seq(
            request_id=request_id,
            prompt=prompt,
            target=min(length, limit),
            stops=length <= limit,
            end_token=sampling.stop_token_ids[0] if sampling.stop_token_ids else sim.eos_token_id,
            filler=sim.token_ids,
            future=asyncio.get_running_loop().create_future(),
            arrival=self._now(),
            wall_arrival=time.monotonic(),
        )

    def _idle_now(self) -> float:
        """Modeled seconds of the idle stretch under way (0 while steps run)."""
        if self._idle_since is None:
            return 0.0
        return (time.monotonic() - self._idle_since) / self._scale

    def _now(self) -> float:
        """Modeled seconds since the engine started."""
        return (time.monotonic() - self._t0) / self._scale

    def _kick(self) -> None:
        """Wake the scheduler (starting it if needed) and end a decode run at its next step."""
        if not self._closed and (self._scheduler is None or self._scheduler.done()):
            self._scheduler = asyncio.get_running_loop().create_task(
                self._run(), name="sim-engine-scheduler"
            )
        self._wakeup.set()
        if self._interrupt is not None and not self._interrupt.done():
            self._interrupt.set_result(None)

    def _signal(self) -> None:
        """Wake every ``_wait_until``."""
        self._progress.set()
        self._progress = asyncio.Event()

    async def _wait_until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self._progress.wait()

    # -- scheduler ---------------------------------------------------------------------------

    @property
    def _frozen(self) -> bool:
        return self._mode in (PauseMode.KEEP, PauseMode.ABORT)

    async def _run(self) -> None:
        """The scheduler task: plan a step, sleep its modeled time, apply it; idle otherwise."""
        while True:
            self._wakeup.clear()
            async with self._lock:
                self._reap()
                step = None if self._frozen else self._plan()
                if step is not None:
                    self._end_idle()
                    await self._execute(step)
            self._signal()
            if step is None:
                self._last_end = None
                if self._idle_since is None:
                    self._idle_since = time.monotonic()
                await self._wakeup.wait()

    def _end_idle(self) -> None:
        """Add the idle stretch under way (if any) to the idle time."""
        self._idle_s += self._idle_now()
        self._idle_since = None

    def _plan(self) -> _Step | None:
        """The next step, as vLLM's scheduler would build it (None: nothing to run)."""
        budget = self._cfg.sim.max_num_batched_tokens
        size, pool, running = self._block_size, self._pool, self._running
        work: list[tuple[_Seq, int]] = []
        preempted = False
        decoding = True  # every scheduled sequence computes its last token only
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            n = seq.num_tokens - seq.num_computed
            decoding = decoding and n == 1
            n = min(n, budget)
            need = -(-(seq.num_computed + n) // size) - len(seq.blocks)
            if need > 0:
                while need > pool.num_free and i < len(running):
                    self._preempt(running.pop())  # the youngest, possibly seq itself
                    self._counters["preemptions"] += 1
                    preempted = True
                if i == len(running):
                    break
                seq.blocks += pool.allocate(need)
            work.append((seq, n))
            budget -= n
            i += 1
        admitted = False
        if not preempted or not work:
            while self._waiting and budget > 0 and len(running) < self._cfg.max_num_seqs:
                taken = self._admit(self._waiting[0], budget)
                if taken == 0:
                    break
                seq = self._waiting.popleft()
                running.append(seq)
                work.append((seq, taken))
                budget -= taken
                admitted = True
        if not work:
            return None
        if decoding and not admitted and not preempted and len(work) == len(running):
            return self._decode_run(work)
        tokens = context = pairs = 0
        for seq, n in work:
            tokens += n
            context += seq.num_computed + n
            pairs += n * seq.num_computed + n * (n + 1) // 2
        return _Step(work, [self.profile.step_time(tokens, context, pairs)], self._version)

    def _admit(self, seq: _Seq, budget: int) -> int:
        """Give ``seq`` its cached prefix and blocks for its first chunk; the chunk's
        tokens, or 0 when the KV cache has no room for it."""
        size = self._block_size
        hits = []
        if self._cfg.enable_prefix_caching:  # at least one token is computed (for its logits)
            hits = self._pool.cached_prefix(seq.block_hashes((seq.num_tokens - 1) // size, size))
        cached = len(hits) * size
        n = min(seq.num_tokens - cached, budget)
        need = -(-(cached + n) // size) - len(hits)
        if need > self._pool.num_free - self._pool.free_among(hits):
            return 0
        self._pool.take(hits)
        seq.blocks = hits + self._pool.allocate(need)
        seq.num_computed = seq.num_registered = cached
        if seq.num_cached is None:
            seq.num_cached = min(cached, len(seq.prompt))
        return n

    def _decode_run(self, work: list[tuple[_Seq, int]]) -> _Step:
        """Up to the next finish (and while free blocks last): steps of one token each."""
        size = self._block_size
        longest = min(MAX_DECODE_RUN, min(s.target - s.num_output for s, _ in work))

        def extra_blocks(steps: int) -> int:
            return sum(
                max(0, -(-(s.num_computed + steps) // size) - len(s.blocks)) for s, _ in work
            )

        steps = longest
        if extra_blocks(longest) > self._pool.num_free:
            low, high = 1, longest  # step 1's blocks are allocated already
            while low < high:
                mid = (low + high + 1) // 2
                if extra_blocks(mid) <= self._pool.num_free:
                    low = mid
                else:
                    high = mid - 1
            steps = low
        context = 0
        for seq, _ in work:
            context += seq.num_computed + 1
            need = -(-(seq.num_computed + steps) // size) - len(seq.blocks)
            if need > 0:
                seq.blocks += self._pool.allocate(need)
        n = len(work)
        durations = [
            self.profile.step_time(n, context + n * k, context + n * k) for k in range(steps)
        ]
        return _Step(work, durations, self._version)

    def _preempt(self, seq: _Seq) -> None:
        """Free ``seq``'s blocks and queue it first, to recompute its tokens (vLLM's recompute)."""
        self._pool.release(seq.blocks)
        seq.blocks = []
        seq.num_computed = seq.num_registered = 0
        self._waiting.appendleft(seq)

    async def _execute(self, step: _Step) -> None:
        """Sleep the step's modeled time (a decode run: until an interrupt's next boundary)."""
        loop = asyncio.get_running_loop()
        # Back-to-back steps start where the last was planned to end: lateness is caught up.
        start = loop.time() if self._last_end is None else min(self._last_end, loop.time())
        ends = list(itertools.accumulate(step.durations))
        done = len(ends)
        if step.is_decode_run:
            self._interrupt = loop.create_future()
            remaining = start + ends[-1] * self._scale - loop.time()
            if remaining > 0:
                await asyncio.wait([self._interrupt], timeout=remaining)
            if self._interrupt.done():
                elapsed = (loop.time() - start) / self._scale
                done = min(len(ends), bisect.bisect_right(ends, elapsed) + 1)
            self._interrupt = None
        end = start + ends[done - 1] * self._scale
        if end > loop.time():
            await asyncio.sleep(end - loop.time())
        self._max_lag_s = max(self._max_lag_s, (loop.time() - end) / self._scale)
        self._last_end = end
        self._busy_s += ends[done - 1]
        self._counters["steps"] += done
        self._apply(step, done)

    def _apply(self, step: _Step, done: int) -> None:
        """Advance the scheduled sequences by ``done`` steps; deliver the finished ones."""
        size, caching, run = self._block_size, self._cfg.enable_prefix_caching, step.is_decode_run
        finished = []
        computed = 0
        for seq, n in step.work:
            if run:  # each step computes the last token and samples the next
                n = done
                seq.num_computed += n
                seq.sample(n, step.version)
            else:
                seq.num_computed += n
                if seq.num_computed == seq.num_tokens:  # not a partial prefill chunk
                    seq.sample(1, step.version)
            computed += n
            if caching and seq.num_computed // size > seq.num_registered:
                self._register(seq)
            keep = -(-seq.num_computed // size)
            if len(seq.blocks) > keep:  # a decode run cut short
                self._pool.release(seq.blocks[keep:])
                del seq.blocks[keep:]
            if seq.num_output >= seq.target:
                finished.append(seq)
        self._counters["computed_tokens"] += computed
        if finished:
            gone = set(finished)
            self._running = [s for s in self._running if s not in gone]
            for seq in finished:
                self._pool.release(seq.blocks)
                seq.blocks = []
                self._deliver(seq, "stop" if seq.stops else "length")

    def _register(self, seq: _Seq) -> None:
        """Cache ``seq``'s newly completed full blocks."""
        full = seq.num_computed // self._block_size
        hashes = seq.block_hashes(full, self._block_size)
        for idx in range(seq.num_registered, full):
            self._pool.register(seq.blocks[idx], hashes[idx])
        seq.num_registered = full

    def _reap(self) -> None:
        """Deliver aborted requests (with their tokens so far) and free their blocks."""
        if not self._aborting:
            return
        for queue in (self._running, self._waiting, self._held):
            for seq in [s for s in queue if s in self._aborting]:
                queue.remove(seq)
                self._pool.release(seq.blocks)
                seq.blocks = []
                self._deliver(seq, "abort")
        self._aborting.clear()

    def _deliver(self, seq: _Seq, finish: str) -> None:
        tokens = seq.response(0, seq.num_output)
        versions: list[int] = []
        for (start, version), (end, _) in itertools.pairwise([*seq.spans, (seq.num_output, None)]):
            versions += [version] * (end - start)
        c = self._counters
        c["requests"] += 1
        c["aborted"] += finish == "abort"
        c["prompt_tokens"] += len(seq.prompt)
        c["cached_prompt_tokens"] += seq.num_cached or 0
        c["generated_tokens"] += len(tokens)
        if seq.future.done():
            return
        seq.future.set_result(
            TokenOutput(
                token_ids=tokens,
                logprobs=[NULL_LOGPROB] * len(tokens),
                finish_reason=finish,
                num_cached_tokens=seq.num_cached or 0,
                weight_version=self._version,
                token_versions=versions,
                num_prompt_tokens=len(seq.prompt),
                metrics={
                    "latency_s": time.monotonic() - seq.wall_arrival,
                    "sim_latency_s": self._now() - seq.arrival,
                },
            )
        )
