"""``AgentLoopOutput``: one training sample produced by an agent loop."""

from __future__ import annotations

from itertools import groupby
from typing import Any

ENV_TOKEN_VERSION = -1
"""``response_versions`` value of tokens the model did not generate (tool/user tokens)."""

ModelSpan = tuple[int, int]
"""``(start, end)``: response tokens ``[start, end)`` were sampled by the model."""


class TrajectoryError(ValueError):
    """An ``AgentLoopOutput`` whose per-token fields disagree."""


class AgentLoopOutput:
    """Token-exact record of one sample.

    ``response_*`` lists are aligned token by token: ``response_mask[i]`` is 1 where the
    model produced ``response_ids[i]`` (with ``response_logprobs[i]`` and the policy
    ``response_versions[i]`` that sampled it) and 0 for tool/user tokens appended by the
    loop (logprob 0.0, version ``ENV_TOKEN_VERSION``).

    Build it from those three lists, or compactly (what ``TrajectoryBuilder`` does) from
    ``model_spans`` (where the model's tokens are) with ``model_logprobs`` and
    ``model_versions`` (one entry per model token, in order). It is stored compactly
    either way, and the per-token lists are laid out anew on every read: a rollout worker
    keeps thousands of finished samples alive until the trainer takes them, and each
    list is memory to write and an object the garbage collector walks. The trainer fills
    its tensors from the compact form.
    """

    __slots__ = (
        "extra",
        "metrics",
        "model_logprobs",
        "model_spans",
        "model_versions",
        "num_turns",
        "prompt_ids",
        "response_ids",
        "reward",
    )

    def __init__(
        self,
        prompt_ids: list[int],
        response_ids: list[int],
        response_mask: list[int] | None = None,
        response_logprobs: list[float] | None = None,
        response_versions: list[int] | None = None,
        *,
        model_spans: list[ModelSpan] | None = None,
        model_logprobs: list[float] | None = None,
        model_versions: list[int] | None = None,
        num_turns: int = 0,
        reward: float | None = None,
        metrics: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        per_token = (response_mask, response_logprobs, response_versions)
        compact = (model_spans, model_logprobs, model_versions)
        if per_token.count(None) == 0 and compact.count(None) == len(compact):
            model_spans, model_logprobs, model_versions = _compact_from_lists(
                response_ids, response_mask, response_logprobs, response_versions
            )
        elif compact.count(None) or per_token.count(None) != len(per_token):
            raise TrajectoryError(
                "give either response_mask, response_logprobs and response_versions, or "
                "model_spans, model_logprobs and model_versions"
            )
        self.prompt_ids = prompt_ids
        self.response_ids = response_ids
        self.model_spans: list[ModelSpan] = model_spans  # type: ignore[assignment]
        self.model_logprobs: list[float] = model_logprobs  # type: ignore[assignment]
        self.model_versions: list[int] = model_versions  # type: ignore[assignment]
        self.num_turns = num_turns
        self.reward = reward
        self.metrics = {} if metrics is None else metrics
        self.extra = {} if extra is None else extra
        self.validate()

    def validate(self) -> None:
        """Raise ``TrajectoryError`` unless the compact fields fit the response."""
        if not self.prompt_ids:
            raise TrajectoryError("prompt_ids is empty")
        n, position, model_tokens = len(self.response_ids), 0, 0
        for start, end in self.model_spans:
            if not position <= start <= end <= n:
                raise TrajectoryError(
                    f"model span [{start}, {end}) is out of order or outside the {n}-token response"
                )
            position, model_tokens = end, model_tokens + end - start
        if len(self.model_logprobs) != model_tokens or len(self.model_versions) != model_tokens:
            raise TrajectoryError(
                f"the model spans hold {model_tokens} tokens but there are "
                f"{len(self.model_logprobs)} logprobs and {len(self.model_versions)} versions"
            )
        if min(self.model_versions, default=0) < 0:
            first = next(i for i, v in enumerate(self.model_versions) if v < 0)
            raise TrajectoryError(
                f"model token {first} (in order of the model's tokens) has no policy version "
                f"({self.model_versions[first]!r})"
            )

    def _lay_out(self, model_values: list[Any], fill: Any) -> list[Any]:
        values = [fill] * len(self.response_ids)
        offset = 0
        for start, end in self.model_spans:
            values[start:end] = model_values[offset : offset + end - start]
            offset += end - start
        return values

    @property
    def response_mask(self) -> list[int]:
        """1 on model tokens, 0 on tool/user tokens (a new list per read)."""
        mask = [0] * len(self.response_ids)
        for start, end in self.model_spans:
            mask[start:end] = [1] * (end - start)
        return mask

    @property
    def response_logprobs(self) -> list[float]:
        """The sampling logprob on model tokens, 0.0 elsewhere (a new list per read)."""
        return self._lay_out(self.model_logprobs, 0.0)

    @property
    def response_versions(self) -> list[int]:
        """The sampling policy's version on model tokens, ``ENV_TOKEN_VERSION`` elsewhere
        (a new list per read)."""
        return self._lay_out(self.model_versions, ENV_TOKEN_VERSION)

    @property
    def num_model_tokens(self) -> int:
        return len(self.model_logprobs)

    @property
    def min_version(self) -> int | None:
        """Oldest policy version among the model's tokens (None if it produced none)."""
        return min(self.model_versions, default=None)

    def _fields(self) -> tuple[Any, ...]:
        return (
            self.prompt_ids,
            self.response_ids,
            self.response_mask,
            list(self.model_logprobs),
            list(self.model_versions),
            self.num_turns,
            self.reward,
            self.metrics,
            self.extra,
        )

    def __eq__(self, other: object) -> bool:
        # Per token: the same sample may be split into spans differently.
        if not isinstance(other, AgentLoopOutput):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # mutable, like the dataclass it replaces

    def __repr__(self) -> str:
        return (
            f"AgentLoopOutput(prompt_ids=<{len(self.prompt_ids)} tokens>, "
            f"response_ids=<{len(self.response_ids)} tokens>, "
            f"model_tokens={self.num_model_tokens}, num_turns={self.num_turns}, "
            f"reward={self.reward!r}, metrics={self.metrics!r}, extra={self.extra!r})"
        )


def _compact_from_lists(
    response_ids: list[int], mask: list[int], logprobs: list[float], versions: list[int]
) -> tuple[list[ModelSpan], list[float], list[int]]:
    """The compact fields of per-token lists, after checking the per-token rules."""
    n = len(response_ids)
    lengths = {"response_mask": len(mask), "response_logprobs": len(logprobs)}
    lengths["response_versions"] = len(versions)
    wrong = {name: length for name, length in lengths.items() if length != n}
    if wrong:
        raise TrajectoryError(f"response_ids has {n} tokens but {wrong}")
    spans: list[ModelSpan] = []
    model_logprobs: list[float] = []
    model_versions: list[int] = []
    start = 0
    for value, run in groupby(mask):
        end = start + len(list(run))
        if value == 1:
            spans.append((start, end))
            model_logprobs += logprobs[start:end]
            model_versions += versions[start:end]
            if min(versions[start:end]) < 0:
                bad = next(i for i in range(start, end) if versions[i] < 0)
                raise TrajectoryError(
                    f"model token {bad} has no policy version ({versions[bad]!r})"
                )
        elif value == 0:
            if any(logprobs[start:end]) or set(versions[start:end]) != {ENV_TOKEN_VERSION}:
                bad = next(
                    i
                    for i in range(start, end)
                    if logprobs[i] != 0.0 or versions[i] != ENV_TOKEN_VERSION
                )
                raise TrajectoryError(
                    f"masked token {bad} must have logprob 0.0 and version "
                    f"{ENV_TOKEN_VERSION}, got {logprobs[bad]!r} and {versions[bad]!r}"
                )
        else:
            raise TrajectoryError(f"response_mask[{start}] = {value!r}, expected 0 or 1")
        start = end
    return spans, model_logprobs, model_versions


def truncate_spans(spans: list[ModelSpan], length: int) -> tuple[list[ModelSpan], int]:
    """``spans`` cut to a response of ``length`` tokens, and how many model tokens they
    keep (a new list; ``spans`` is not changed)."""
    cut: list[ModelSpan] = []
    kept = 0
    for start, end in spans:
        if start >= length:
            break
        end = min(end, length)
        cut.append((start, end))
        kept += end - start
    return cut, kept
