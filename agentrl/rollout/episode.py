"""Episode requests and results exchanged between the manager and its workers."""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from agentrl.core.trajectory import AgentLoopOutput
from agentrl.core.types import SamplingParams


@dataclass
class EpisodeRequest:
    """One episode to run: sample ``sample_index`` of dataset row ``row_index``.

    ``group_id`` is shared by the ``n`` episodes of one row (GRPO-style groups);
    ``episode_id`` doubles as the session id that pins the episode to one replica.
    """

    row: dict[str, Any]
    row_index: int
    sample_index: int
    group_id: str
    sampling: SamplingParams
    episode_id: str = field(default_factory=lambda: f"ep-{uuid.uuid4().hex}")


@dataclass
class EpisodeResult:
    """What one episode produced: its training samples, or the error that ended it.

    ``external``: a gateway session of a free-running client (``episode_from_session``),
    not started by the rollout producer: it has no dataset row (``row_index`` -1), its
    outputs carry their reward, and it took no slot of the staleness rule.
    ``retries``: times it ran again because its agent-loop worker died under it.
    """

    episode_id: str
    group_id: str
    row_index: int
    sample_index: int
    agent_name: str
    outputs: list[AgentLoopOutput] = field(default_factory=list)
    error: str | None = None
    latency_s: float = 0.0
    external: bool = False
    retries: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None

    @functools.cached_property
    def oldest_version(self) -> int | None:
        """Oldest policy version among its model tokens (None if it produced none).

        Computed once: a finished episode's tokens do not change, and the trajectory queue
        asks on every arrival for every episode it holds."""
        versions = [v for output in self.outputs if (v := output.min_version) is not None]
        return min(versions, default=None)


EXTERNAL_AGENT_NAME = "gateway"
"""``agent_name`` of episodes built from gateway sessions."""


def episode_from_session(
    session_id: str,
    samples: list[AgentLoopOutput],
    reward: float | None,
    group_id: str,
    sample_index: int = 0,
    max_response_length: int | None = None,
) -> EpisodeResult:
    """The ``EpisodeResult`` of a finished gateway session (``external``; episode id =
    session id, so one session is one episode), taking over its ``samples``.

    Their rewards are kept (the session ``reward`` when given, else each sample's sum of
    per-call rewards, 0.0 for a sample without one); a session with no reward at all or
    no samples is a failed episode. Responses longer than ``max_response_length`` are
    cut (``extra["truncated"]``), as ``ExternalAgentLoop`` does.
    """
    episode = EpisodeResult(
        session_id, group_id, -1, sample_index, EXTERNAL_AGENT_NAME, external=True
    )
    if not samples:
        episode.error = f"gateway session {session_id} recorded no model calls"
        return episode
    rewards = [reward if reward is not None else sample.reward for sample in samples]
    if all(r is None for r in rewards):
        episode.error = (
            f"gateway session {session_id} finished without a reward (POST "
            "/v1/sessions/{id}/reward or a `reward` in the finish body)"
        )
        return episode
    for sample, sample_reward in zip(samples, rewards, strict=True):
        sample.reward = float(sample_reward or 0.0)
        sample.truncate(max_response_length or None)
    episode.outputs = samples
    return episode


def make_requests(
    rows: list[dict[str, Any]], n: int, sampling: SamplingParams, first_row_index: int = 0
) -> list[EpisodeRequest]:
    """``n`` episode requests per row, rows in order, samples of a row adjacent.

    With ``sampling.seed`` set, each episode gets its own seed derived from it and the
    episode's (row index, sample index), so a rerun samples the same tokens.
    """
    requests = []
    for offset, row in enumerate(rows):
        group_id = f"grp-{uuid.uuid4().hex}"
        index = first_row_index + offset
        requests.extend(
            EpisodeRequest(row, index, k, group_id, _episode_sampling(sampling, index, k))
            for k in range(n)
        )
    return requests


def _episode_sampling(
    sampling: SamplingParams, row_index: int, sample_index: int
) -> SamplingParams:
    if sampling.seed is None:
        return sampling
    return replace(sampling, seed=(sampling.seed * 1_000_003 + row_index * 1009 + sample_index))
