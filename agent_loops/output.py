"""``AgentLoopOutput``: one training sample produced by an agent loop."""

from __future__ import annotations

import operator
from dataclasses import InitVar, dataclass, field
from itertools import compress
from typing import Any

ENV_TOKEN_VERSION = -1
"""``response_versions`` value of tokens the model did not generate (tool/user tokens)."""


class TrajectoryError(ValueError):
    """An ``AgentLoopOutput`` whose per-token fields disagree."""


@dataclass
class AgentLoopOutput:
    """Token-exact record of one sample.

    ``response_*`` lists are aligned token by token: ``response_mask[i]`` is 1 where the
    model produced ``response_ids[i]`` (with ``response_logprobs[i]`` and the policy
    ``response_versions[i]`` that sampled it) and 0 for tool/user tokens appended by the
    loop (logprob 0.0, version ``ENV_TOKEN_VERSION``).
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    response_versions: list[int]
    num_turns: int = 0
    reward: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    check_tokens: InitVar[bool] = True
    """False skips the per-token rules (not the length checks) for producers whose
    construction guarantees them, such as ``TrajectoryBuilder``."""

    def __post_init__(self, check_tokens: bool) -> None:
        self.validate(check_tokens)

    def validate(self, check_tokens: bool = True) -> None:
        """Raise ``TrajectoryError`` unless all per-token lists are consistent."""
        n = len(self.response_ids)
        lengths = (
            len(self.response_mask),
            len(self.response_logprobs),
            len(self.response_versions),
        )
        if lengths != (n, n, n):
            names = ("response_mask", "response_logprobs", "response_versions")
            wrong = {
                name: length for name, length in zip(names, lengths, strict=True) if length != n
            }
            raise TrajectoryError(f"response_ids has {n} tokens but {wrong}")
        if not self.prompt_ids:
            raise TrajectoryError("prompt_ids is empty")
        if check_tokens and not self._tokens_consistent():
            self._raise_first_inconsistency()

    def _tokens_consistent(self) -> bool:
        """The per-token rules, checked with C-level iteration (the common, valid case)."""
        mask, versions = self.response_mask, self.response_versions
        if not set(mask) <= {0, 1}:
            return False
        env = list(map(operator.not_, mask))
        masked_versions_ok = set(compress(versions, env)) <= {ENV_TOKEN_VERSION}
        masked_logprobs_ok = not any(compress(self.response_logprobs, env))
        model_versions_ok = min(compress(versions, mask), default=0) >= 0
        return masked_versions_ok and masked_logprobs_ok and model_versions_ok

    def _raise_first_inconsistency(self) -> None:
        for i, (m, lp, v) in enumerate(
            zip(self.response_mask, self.response_logprobs, self.response_versions, strict=True)
        ):
            if m not in (0, 1):
                raise TrajectoryError(f"response_mask[{i}] = {m!r}, expected 0 or 1")
            if m == 0 and (lp != 0.0 or v != ENV_TOKEN_VERSION):
                raise TrajectoryError(
                    f"masked token {i} must have logprob 0.0 and version {ENV_TOKEN_VERSION}, "
                    f"got {lp!r} and {v!r}"
                )
            if m == 1 and v < 0:
                raise TrajectoryError(f"model token {i} has no policy version ({v!r})")

    @property
    def num_model_tokens(self) -> int:
        return sum(self.response_mask)

    @property
    def min_version(self) -> int | None:
        """Oldest policy version among the model's tokens (None if it produced none)."""
        versions = [v for v, m in zip(self.response_versions, self.response_mask, strict=True) if m]
        return min(versions) if versions else None
