"""Session recording: every call's exact ids, linked into token-exact training samples.

A session is one episode of an external agent. Each generated choice becomes a
``CallRecord`` (prompt ids, completion ids, logprobs, policy versions). A new call whose
prompt ids start with an earlier record's prompt + completion *continues* it: the ids in
between are the environment's (tool results, user turns; mask 0). Records that continue
one another form one sample, an ``AgentLoopOutput`` built with the agent loops'
``TrajectoryBuilder``:

    prompt_ids   = first call's prompt
    response_ids = completion₁ + delta₂ + completion₂ + delta₃ + ...   (mask 1, 0, 1, 0, ...)

A call that continues no record starts a new sample (a *divergence*: the client rewrote
history, or the template renders it differently); a call that continues a record some
other call already continued starts a new sample too (a *branch*: retries, ``n > 1``).
Both are counted in the session's metrics.

A session may belong to a client-given *group* (``x-group-id``; sessions of one group
are one GRPO group in the trainer) and may be *managed* (driven by ``ExternalAgentLoop``,
which takes its samples from ``finish``); both reach the sink in ``SessionInfo``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from agentrl.core.trajectory import AgentLoopOutput, TrajectoryBuilder
from agentrl.core.types import TokenOutput
from agentrl.server.gateway.errors import GatewayError
from agentrl.server.gateway.sink import SessionInfo, TrajectorySink, accepts_info

logger = logging.getLogger(__name__)


@dataclass
class CallRecord:
    """One generated choice of one call, with what a later call must repeat to continue it.

    ``key`` is the conversation this choice completes, in the endpoint's terms (chat: the
    tools and canonical messages including the reply; text: prompt + completion text);
    None for token-level calls, which are linked by ids alone.
    """

    call_id: str
    choice: int
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    replica_id: str
    key: Any = None
    index: int = -1
    sample: int = -1

    @property
    def full_ids(self) -> list[int]:
        return self.prompt_ids + self.completion_ids

    @property
    def last_token(self) -> int | None:
        return self.completion_ids[-1] if self.completion_ids else None


@dataclass
class Completion:
    """What the endpoint hands the recorder for one choice."""

    output: TokenOutput
    completion_ids: list[int]
    finish_reason: str
    key: Any = None


@dataclass
class Session:
    """The recorded calls of one session and their grouping into samples."""

    session_id: str
    created: float
    last_active: float
    records: list[CallRecord] = field(default_factory=list)
    samples: list[list[int]] = field(default_factory=list)
    counters: Counter[str] = field(default_factory=Counter)
    reward: float | None = None
    call_rewards: dict[str, float] = field(default_factory=dict)
    finished_at: float | None = None
    finish_reason: str | None = None
    group_id: str | None = None
    managed: bool = False

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    def join_group(self, group_id: str | None) -> None:
        """Put the session in ``group_id`` (None: no change); 409 if it is in another."""
        if group_id is None or group_id == self.group_id:
            return
        if self.group_id is not None:
            raise GatewayError(
                409,
                f"session {self.session_id!r} is in group {self.group_id!r}, not {group_id!r}",
                param="group_id",
                code="group_conflict",
            )
        self.group_id = group_id

    @property
    def info(self) -> SessionInfo:
        return SessionInfo(self.group_id, self.managed, self.finish_reason or "finished")

    def _is_tip(self, record: CallRecord) -> bool:
        return self.samples[record.sample][-1] == record.index

    def find_by_key(self, match: Callable[[Any], int | None]) -> CallRecord | None:
        """The record whose key ``match`` scores highest (None scores are skipped);
        ties prefer a record nothing has continued yet, then the latest."""
        best: tuple[int, bool, int] | None = None
        for record in self.records:
            score = match(record.key) if record.key is not None else None
            if score is None:
                continue
            rank = (score, self._is_tip(record), record.index)
            if best is None or rank > best:
                best = rank
        return None if best is None else self.records[best[2]]

    def _parent(self, prompt_ids: list[int]) -> CallRecord | None:
        """The record with the longest prompt + completion that ``prompt_ids`` starts with."""
        best: CallRecord | None = None
        for record in self.records:
            n = len(record.prompt_ids) + len(record.completion_ids)
            if n > len(prompt_ids) or (best is not None and n < len(best.full_ids)):
                continue
            if prompt_ids[:n] != record.full_ids:
                continue
            if best is None or n > len(best.full_ids) or self._is_tip(record):
                best = record
        return best

    def add_call(
        self, call_id: str, prompt_ids: list[int], completions: list[Completion], now: float
    ) -> None:
        """Record the choices of one call and link each into a sample."""
        parent = self._parent(prompt_ids)
        for choice, completion in enumerate(completions):
            out = completion.output
            n = len(completion.completion_ids)
            record = CallRecord(
                call_id=call_id,
                choice=choice,
                prompt_ids=list(prompt_ids),
                completion_ids=list(completion.completion_ids),
                logprobs=list(out.logprobs[:n]),
                versions=list(out.token_versions[:n]),
                finish_reason=completion.finish_reason,
                replica_id=out.replica_id,
                key=completion.key,
                index=len(self.records),
            )
            self.records.append(record)
            if parent is not None and choice == 0 and self._is_tip(parent):
                record.sample = parent.sample
                self.samples[parent.sample].append(record.index)
                self.counters["continued_calls"] += 1
            else:
                record.sample = len(self.samples)
                self.samples.append([record.index])
                if parent is not None or choice > 0:
                    self.counters["branches"] += 1
                elif len(self.records) > 1:
                    self.counters["divergences"] += 1
                    logger.info(
                        "session %s: call %s continues no recorded call; new sample",
                        self.session_id,
                        call_id,
                    )
        self.counters["calls"] += 1
        self.last_active = now

    def sample_reward(self, call_ids: list[str]) -> float | None:
        """The session reward if set, else the sum of the sample's per-call rewards."""
        if self.reward is not None:
            return self.reward
        given = [self.call_rewards[c] for c in dict.fromkeys(call_ids) if c in self.call_rewards]
        return sum(given) if given else None

    def build_sample(self, chain: list[int]) -> AgentLoopOutput:
        """The training sample of a chain of record indices."""
        records = [self.records[i] for i in chain]
        prompt_ids = records[0].prompt_ids
        trajectory = TrajectoryBuilder(list(prompt_ids))
        position = len(prompt_ids)
        for record in records:
            delta = record.prompt_ids[position:]
            if delta:
                trajectory.add_env_tokens(delta)
            trajectory.add_model_tokens(record.completion_ids, record.logprobs, record.versions)
            position = len(record.prompt_ids) + len(record.completion_ids)
        call_ids = [r.call_id for r in records]
        sample = trajectory.build(
            metrics={"gateway/sample_calls": len(records)},
            extra={
                "session_id": self.session_id,
                "call_ids": call_ids,
                "finish_reasons": [r.finish_reason for r in records],
                "replica_ids": [r.replica_id for r in records],
                "turn_rewards": [self.call_rewards.get(c) for c in call_ids],
            },
        )
        sample.reward = self.sample_reward(call_ids)
        return sample

    def metrics(self) -> dict[str, float]:
        names = (
            "calls",
            "continued_calls",
            "divergences",
            "branches",
            "reused_prompt_tokens",
            "malformed_tool_calls",
        )
        return {f"gateway/{name}": float(self.counters[name]) for name in names} | {
            "gateway/samples": float(len(self.samples))
        }

    def to_json(self) -> dict[str, Any]:
        """The recorded trajectory: session state, metrics and each sample as a dict."""
        return {
            "session_id": self.session_id,
            "finished": self.finished,
            "finish_reason": self.finish_reason,
            "reward": self.reward,
            "call_rewards": dict(self.call_rewards),
            "group_id": self.group_id,
            "managed": self.managed,
            "metrics": self.metrics(),
            "samples": [asdict(self.build_sample(chain)) for chain in self.samples],
        }


class SessionStore:
    """Sessions by id, bounded in number and time.

    At ``max_sessions`` the finished session that finished first is dropped; unfinished
    sessions are never dropped, so a new session is refused (429) when all are open.
    An unfinished session idle for ``ttl_s`` is finished (reason ``expired``) and sent
    to the sink; a finished session is forgotten ``ttl_s`` after it finished.
    """

    def __init__(
        self,
        sink: TrajectorySink,
        max_sessions: int,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sink = sink
        self._sink_takes_info = accepts_info(sink)
        self._max_sessions = max_sessions
        self._ttl_s = ttl_s
        self._clock = clock
        self._sessions: dict[str, Session] = {}
        self._next_sweep = 0.0

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: str) -> Session:
        """The session, or a 404 error."""
        session = self._sessions.get(session_id)
        if session is None:
            raise GatewayError(404, f"session {session_id!r} not found", code="session_not_found")
        return session

    async def open(
        self, session_id: str, group_id: str | None = None, managed: bool = False
    ) -> Session:
        """The session to record a call in (created if new); 409 if it is finished or
        in another group than ``group_id``. ``managed`` marks it as ``ExternalAgentLoop``'s."""
        await self.sweep()
        now = self._clock()
        session = self._sessions.get(session_id)
        if session is None:
            self._make_room()
            session = Session(session_id, created=now, last_active=now)
            self._sessions[session_id] = session
        elif session.finished:
            raise GatewayError(
                409,
                f"session {session_id!r} is finished; start a new session id",
                code="session_finished",
            )
        session.join_group(group_id)
        session.managed = session.managed or managed
        session.last_active = now
        return session

    def _make_room(self) -> None:
        if len(self._sessions) < self._max_sessions:
            return
        finished = [s for s in self._sessions.values() if s.finished]
        if not finished:
            raise GatewayError(
                429,
                f"all {self._max_sessions} stored sessions are unfinished; finish sessions "
                "(POST /v1/sessions/{id}/finish) or raise gateway.max_sessions",
                code="too_many_sessions",
            )
        oldest = min(finished, key=lambda s: s.finished_at or 0.0)
        del self._sessions[oldest.session_id]
        logger.debug("dropped finished session %s to make room", oldest.session_id)

    def set_rewards(
        self, session_id: str, reward: float | None, call_rewards: dict[str, float] | None
    ) -> Session:
        """Set the session reward and/or per-call rewards (keyed by call id)."""
        session = self.get(session_id)
        if session.finished:
            raise GatewayError(
                409, f"session {session_id!r} is finished; rewards must come before finish"
            )
        if call_rewards:
            unknown = sorted(set(call_rewards) - {r.call_id for r in session.records})
            if unknown:
                raise GatewayError(
                    400,
                    f"unknown call id(s) {unknown[:5]} in session {session_id!r}",
                    param="rewards",
                )
            session.call_rewards.update(call_rewards)
        if reward is not None:
            session.reward = reward
        return session

    async def finish(
        self,
        session_id: str,
        reward: float | None = None,
        reason: str = "finished",
        group_id: str | None = None,
    ) -> Session:
        """Finish the session (idempotent) and send its samples to the sink once;
        ``reward`` and ``group_id``, if given, are set first."""
        session = self.get(session_id)
        if session.finished:
            return session
        session.join_group(group_id)
        if reward is not None:
            session.reward = reward
        session.finished_at = self._clock()
        session.finish_reason = reason
        samples = [session.build_sample(chain) for chain in session.samples]
        if self._sink_takes_info:
            await self._sink.put(session_id, samples, session.reward, session.info)  # type: ignore[call-arg]
        else:
            await self._sink.put(session_id, samples, session.reward)
        logger.debug("session %s %s with %d sample(s)", session_id, reason, len(samples))
        return session

    async def sweep(self) -> None:
        """Expire idle sessions and forget old finished ones (at most once a second);
        retry a sink that holds undelivered sessions (``held`` / ``flush``)."""
        now = self._clock()
        if now < self._next_sweep:
            return
        self._next_sweep = now + 1.0
        if getattr(self._sink, "held", 0):
            await self._sink.flush()  # type: ignore[attr-defined]
        for session in list(self._sessions.values()):
            if session.finished and now - (session.finished_at or now) > self._ttl_s:
                del self._sessions[session.session_id]
            elif not session.finished and now - session.last_active > self._ttl_s:
                await self.finish(session.session_id, reason="expired")
