"""The staleness rule that bounds how far rollouts may run ahead of training.

With maximum staleness η, batch size B (episodes per training step) and s training steps
finished since the producer started, the producer may have started at most
``(η + s + 1)·B`` episodes in total, so it may start

    capacity = (η + s + 1)·B − (accepted + running)

more, and never more than the concurrency cap allows. ``accepted`` counts episodes that
finished and were kept; ``running`` those in flight. s is the policy version when every
step pushes new weights and the run started at version 0; it is counted apart from the
version so that a step that made no update (too few usable samples) still frees its
batch's slots, and a resumed run starts with the budget of a fresh one. η = 0 allows
exactly one batch per step (the synchronous loop); η = 1 is one-step-off-policy; larger
η is fully async. Over-sampling (``extra``) adds a fixed number of episodes to the
budget, so that a step can take the first B to finish and leave its stragglers to a later
one. The rule bounds how many episodes are in the system per step; an
episode that runs much longer than its peers can still fall more than η versions behind
by the time it is trained, so the queue checks each episode's oldest token version when
it is consumed and drops (or down-weights) stale ones, giving their slots back with
``discard_accepted``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StalenessController:
    """Counts started/finished episodes and answers how many more may start now."""

    max_staleness: int
    batch_size: int
    max_concurrency: int
    extra: int = 0
    """Episodes the producer may start beyond ``(η + s + 1)·B`` (over-sampling)."""
    version: int = 0
    steps: int = 0
    accepted: int = 0
    running: int = 0
    rejected: int = 0

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.max_staleness}")
        if self.batch_size < 1 or self.max_concurrency < 1:
            raise ValueError("batch_size and max_concurrency must be >= 1")
        if self.extra < 0:
            raise ValueError(f"extra must be >= 0, got {self.extra}")

    @property
    def capacity(self) -> int:
        """Episodes that may start now."""
        budget = (self.max_staleness + self.steps + 1) * self.batch_size + self.extra
        by_staleness = budget - (self.accepted + self.running)
        return max(0, min(by_staleness, self.max_concurrency - self.running))

    def start(self, count: int = 1) -> None:
        """Record ``count`` started episodes; refuses to exceed the capacity."""
        if count > self.capacity:
            raise RuntimeError(f"starting {count} episodes exceeds capacity {self.capacity}")
        self.running += count

    def finish(self, kept: bool = True) -> None:
        """An episode ended: ``kept`` ones count as accepted; rejected ones free their slot."""
        if self.running <= 0:
            raise RuntimeError("finish() without a running episode")
        self.running -= 1
        if kept:
            self.accepted += 1
        else:
            self.rejected += 1

    def discard_accepted(self) -> None:
        """An accepted episode was dropped later (e.g. stale): its slot becomes free again."""
        if self.accepted <= 0:
            raise RuntimeError("discard_accepted() without an accepted episode")
        self.accepted -= 1
        self.rejected += 1

    def set_version(self, version: int) -> None:
        """The trainer moved to ``version`` (monotonic), one step per new version."""
        if version < self.version:
            raise ValueError(f"version went back from {self.version} to {version}")
        self.steps += version - self.version
        self.version = version

    def finish_step(self, version: int) -> None:
        """The trainer finished one step and now serves ``version``: the same version
        when the step made no update, which frees that batch's slots all the same."""
        if version == self.version:
            self.steps += 1
        else:
            self.set_version(version)
