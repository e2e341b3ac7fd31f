"""Session-affine replica choice for KV-cache reuse (pure Python; no Ray).

Every turn of a multi-turn episode re-sends the whole conversation so far. When it lands
on the replica that served the previous turn, that replica's prefix cache already holds
the conversation's KV blocks and only the new tokens are computed.

Rules, in order:

1. A request without a session goes to the least-loaded replica.
2. The first request of a session goes to the least-loaded replica and the session
   sticks to it (an LRU map bounded by ``max_sessions``).
3. Later requests go to the sticky replica for as long as it lives and has room: a
   session never moves because another replica is less busy (a replica that starts,
   or restarts after a crash, gets new sessions, not the running ones).
4. A session whose replica disappeared (died, scaled down) or failed its last request
   (the client passes it in ``avoid``) moves to the least-loaded replica (``failovers``);
   the next requests stick there.
5. A session whose replica is full (the caller passes it in ``full``: it holds as many
   requests as it accepts) moves to the least-loaded replica with room (``moves``).

"Least loaded" is the fewest in-flight requests routed by this policy, ties broken by
the fewest sticky sessions, then by replica id, so a burst of new sessions spreads evenly.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, fields


@dataclass
class AffinityStats:
    """Counters a policy keeps for monitoring and benchmarks."""

    sticky_hits: int = 0
    new_sessions: int = 0
    moves: int = 0
    failovers: int = 0
    evictions: int = 0
    sessionless: int = 0


class SessionAffinityPolicy:
    """Chooses a replica per request and tracks in-flight counts per replica."""

    def __init__(self, max_sessions: int = 100_000) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self.max_sessions = max_sessions
        self.stats = AffinityStats()
        self._sessions: OrderedDict[str, str] = OrderedDict()
        self._sessions_per_replica: Counter[str] = Counter()
        self._in_flight: Counter[str] = Counter()
        self._request_replica: dict[str, str] = {}

    def in_flight(self, replica: str) -> int:
        """Requests routed to ``replica`` that have not completed yet."""
        return self._in_flight[replica]

    def replica_of(self, session_id: str) -> str | None:
        """The sticky replica of ``session_id`` (None if unknown or evicted)."""
        return self._sessions.get(session_id)

    @property
    def num_sessions(self) -> int:
        return len(self._sessions)

    def choose(
        self,
        session_id: str | None,
        candidates: Sequence[str],
        avoid: Collection[str] = (),
        full: Collection[str] = (),
    ) -> str:
        """Pick the replica for one request of ``session_id`` among ``candidates``.

        Replicas in ``avoid`` (where this request just failed) are skipped unless no other
        candidate is left; replicas in ``full`` (no room for another request) take no new
        session and no moved one, unless every candidate is full.
        """
        if not candidates:
            raise ValueError("no replica to choose from")
        candidates = [r for r in candidates if r not in avoid] or list(candidates)
        roomy = [r for r in candidates if r not in full] or candidates
        least = min(roomy, key=lambda r: (self._in_flight[r], self._sessions_per_replica[r], r))
        if session_id is None:
            self.stats.sessionless += 1
            return least
        sticky = self._sessions.get(session_id)
        if sticky is None:
            self.stats.new_sessions += 1
            self._assign(session_id, least)
            return least
        if sticky not in candidates:
            self.stats.failovers += 1
            self._assign(session_id, least)
            return least
        if sticky not in roomy:
            self.stats.moves += 1
            self._assign(session_id, least)
            return least
        self.stats.sticky_hits += 1
        self._sessions.move_to_end(session_id)
        return sticky

    def pin(self, session_ids: Iterable[str], replica: str, candidates: Collection[str]) -> None:
        """Record ``session_ids`` as sticky to ``replica``: one request that carries them
        all was routed there (coalesced requests, routed by another session of theirs).

        Counted per session as ``choose`` would: a new session, a sticky hit, a failover
        (its replica is no longer among ``candidates``) or a move.
        """
        for session_id in session_ids:
            sticky = self._sessions.get(session_id)
            if sticky == replica:
                self.stats.sticky_hits += 1
                self._sessions.move_to_end(session_id)
                continue
            if sticky is None:
                self.stats.new_sessions += 1
            elif sticky not in candidates:
                self.stats.failovers += 1
            else:
                self.stats.moves += 1
            self._assign(session_id, replica)

    def on_routed(self, request_id: str, replica: str) -> None:
        """Count ``request_id`` as in flight on ``replica`` (re-routing replaces the old entry)."""
        self.on_completed(request_id)
        self._request_replica[request_id] = replica
        self._in_flight[replica] += 1

    def on_completed(self, request_id: str) -> None:
        """Stop counting ``request_id`` (idempotent; unknown ids are ignored)."""
        replica = self._request_replica.pop(request_id, None)
        if replica is not None:
            self._in_flight[replica] = max(0, self._in_flight[replica] - 1)

    def remove_replica(self, replica: str) -> None:
        """Forget a dead replica: its sessions fail over on their next request."""
        self._in_flight.pop(replica, None)
        for request_id in [r for r, rep in self._request_replica.items() if rep == replica]:
            del self._request_replica[request_id]

    def _assign(self, session_id: str, replica: str) -> None:
        old = self._sessions.pop(session_id, None)
        if old is not None:
            self._sessions_per_replica[old] -= 1
        self._sessions[session_id] = replica
        self._sessions_per_replica[replica] += 1
        while len(self._sessions) > self.max_sessions:
            _, evicted_replica = self._sessions.popitem(last=False)
            self._sessions_per_replica[evicted_replica] -= 1
            self.stats.evictions += 1


_registry: dict[str, list[SessionAffinityPolicy]] = {}
_registry_lock = threading.Lock()
_replicas: dict[str, frozenset[str]] = {}


def register_policy(deployment: str, policy: SessionAffinityPolicy) -> None:
    """Make ``policy``'s counters visible to ``affinity_stats`` in this process.

    A process may hold several routers of one deployment (``DataClient`` routes its
    generate calls through a handle of their own); their counters add up.
    """
    with _registry_lock:
        _registry.setdefault(deployment, []).append(policy)


def affinity_stats() -> dict[str, AffinityStats]:
    """Every affinity router's counters in this process, summed by deployment name."""
    with _registry_lock:
        return {name: _total(policies) for name, policies in _registry.items()}


def _total(policies: list[SessionAffinityPolicy]) -> AffinityStats:
    names = [f.name for f in fields(AffinityStats)]
    return AffinityStats(**{n: sum(getattr(p.stats, n) for p in policies) for n in names})


def note_replicas(deployment: str, replicas: Iterable[str]) -> None:
    """Record the replicas a router of ``deployment`` in this process last chose among."""
    with _registry_lock:
        _replicas[deployment] = frozenset(replicas)


def known_replicas(deployment: str) -> int:
    """How many replicas this process's routers of ``deployment`` last saw (0: none yet).

    A hint for spreading a burst of new sessions (``DataClient``'s coalescing): the
    router still places every request itself.
    """
    with _registry_lock:
        return len(_replicas.get(deployment, ()))
