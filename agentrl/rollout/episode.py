"""Episode requests and results exchanged between the manager and its workers."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from agentrl.agent_loops.output import AgentLoopOutput
from agentrl.ids import new_id
from agentrl.server.types import SamplingParams


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
    episode_id: str = field(default_factory=lambda: new_id("ep-"))


@dataclass
class EpisodeResult:
    """What one episode produced: its training samples, or the error that ended it."""

    episode_id: str
    group_id: str
    row_index: int
    sample_index: int
    agent_name: str
    outputs: list[AgentLoopOutput] = field(default_factory=list)
    error: str | None = None
    latency_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


def make_requests(
    rows: list[dict[str, Any]], n: int, sampling: SamplingParams, first_row_index: int = 0
) -> list[EpisodeRequest]:
    """``n`` episode requests per row, rows in order, samples of a row adjacent.

    With ``sampling.seed`` set, each episode gets its own seed derived from it and the
    episode's (row index, sample index), so a rerun samples the same tokens.
    """
    requests = []
    for offset, row in enumerate(rows):
        group_id = new_id("grp-")
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
