"""``AgentLoopOutput``: one training sample produced by an agent loop."""

from __future__ import annotations

import operator
from itertools import groupby
from typing import Any

ENV_TOKEN_VERSION = -1
"""``response_versions`` value of tokens the model did not generate (tool/user tokens)."""

ModelSpan = tuple[int, int, list[float], list[int]]
"""``(start, end, logprobs, versions)``: response tokens ``[start, end)`` were sampled by
the model, with one logprob and one policy version per token."""


class TrajectoryError(ValueError):
    """An ``AgentLoopOutput`` whose per-token fields disagree."""


class AgentLoopOutput:
    """Token-exact record of one sample.

    ``response_*`` lists are aligned token by token: ``response_mask[i]`` is 1 where the
    model produced ``response_ids[i]`` (with ``response_logprobs[i]`` and the policy
    ``response_versions[i]`` that sampled it) and 0 for tool/user tokens appended by the
    loop (logprob 0.0, version ``ENV_TOKEN_VERSION``).

    Build it from those three lists, or from ``model_spans`` (what ``TrajectoryBuilder``
    records, one span per model turn): the sample is stored as spans either way, and the
    per-token lists are laid out anew on every read. A rollout keeps and ships only the
    token ids and the engine's own per-turn lists; the trainer fills its tensors from the
    spans (``model_spans``) without per-token Python lists.
    """

    __slots__ = (
        "extra",
        "metrics",
        "model_spans",
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
        num_turns: int = 0,
        reward: float | None = None,
        metrics: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        per_token = (response_mask, response_logprobs, response_versions)
        missing = per_token.count(None)
        if model_spans is None:
            if missing:
                raise TrajectoryError(
                    "give response_mask, response_logprobs and response_versions, or model_spans"
                )
            model_spans = _spans_from_lists(response_ids, *per_token)  # type: ignore[arg-type]
        elif missing != len(per_token):
            raise TrajectoryError("give either the per-token lists or model_spans, not both")
        self.prompt_ids = prompt_ids
        self.response_ids = response_ids
        self.model_spans = model_spans
        self.num_turns = num_turns
        self.reward = reward
        self.metrics = {} if metrics is None else metrics
        self.extra = {} if extra is None else extra
        self.validate()

    def validate(self) -> None:
        """Raise ``TrajectoryError`` unless the spans fit the response and each other."""
        if not self.prompt_ids:
            raise TrajectoryError("prompt_ids is empty")
        n = len(self.response_ids)
        if self.model_spans and not _spans_consistent(self.model_spans, n):
            _raise_first_bad_span(self.model_spans, n)

    @property
    def response_mask(self) -> list[int]:
        """1 on model tokens, 0 on tool/user tokens (a new list per read)."""
        mask = [0] * len(self.response_ids)
        for start, end, _, _ in self.model_spans:
            mask[start:end] = [1] * (end - start)
        return mask

    @property
    def response_logprobs(self) -> list[float]:
        """The sampling logprob on model tokens, 0.0 elsewhere (a new list per read)."""
        logprobs = [0.0] * len(self.response_ids)
        for start, end, span_logprobs, _ in self.model_spans:
            logprobs[start:end] = span_logprobs
        return logprobs

    @property
    def response_versions(self) -> list[int]:
        """The sampling policy's version on model tokens, ``ENV_TOKEN_VERSION`` elsewhere
        (a new list per read)."""
        versions = [ENV_TOKEN_VERSION] * len(self.response_ids)
        for start, end, _, span_versions in self.model_spans:
            versions[start:end] = span_versions
        return versions

    @property
    def num_model_tokens(self) -> int:
        return sum(end - start for start, end, _, _ in self.model_spans)

    @property
    def min_version(self) -> int | None:
        """Oldest policy version among the model's tokens (None if it produced none)."""
        return min((min(v) for _, _, _, v in self.model_spans if v), default=None)

    def _fields(self) -> tuple[Any, ...]:
        return (
            self.prompt_ids,
            self.response_ids,
            self.response_mask,
            self.response_logprobs,
            self.response_versions,
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


def _spans_consistent(spans: list[ModelSpan], n: int) -> bool:
    """The span rules, checked with C-level iteration (the common, valid case): in order,
    inside the response, one logprob and one non-negative version per token."""
    starts, ends, logprobs, versions = zip(*spans, strict=True)
    sizes = list(map(operator.sub, ends, starts))
    return (
        starts[0] >= 0
        and ends[-1] <= n
        and all(map(operator.le, starts, ends))
        and all(map(operator.le, ends[:-1], starts[1:]))
        and sizes == list(map(len, logprobs)) == list(map(len, versions))
        and min(map(min, filter(None, versions)), default=0) >= 0
    )


def _raise_first_bad_span(spans: list[ModelSpan], n: int) -> None:
    position = 0
    for start, end, logprobs, versions in spans:
        if not position <= start <= end <= n:
            raise TrajectoryError(
                f"model span [{start}, {end}) is out of order or outside the {n}-token response"
            )
        if len(logprobs) != end - start or len(versions) != end - start:
            raise TrajectoryError(
                f"model span at response token {start} has {end - start} tokens, "
                f"{len(logprobs)} logprobs and {len(versions)} versions"
            )
        if versions and min(versions) < 0:
            raise TrajectoryError(
                f"model span at response token {start} has a token without a policy "
                f"version: {versions}"
            )
        position = end


def _spans_from_lists(
    response_ids: list[int], mask: list[int], logprobs: list[float], versions: list[int]
) -> list[ModelSpan]:
    """The model spans of per-token lists, after checking the per-token rules."""
    n = len(response_ids)
    lengths = {"response_mask": len(mask), "response_logprobs": len(logprobs)}
    lengths["response_versions"] = len(versions)
    wrong = {name: length for name, length in lengths.items() if length != n}
    if wrong:
        raise TrajectoryError(f"response_ids has {n} tokens but {wrong}")
    spans: list[ModelSpan] = []
    start = 0
    for value, run in groupby(mask):
        end = start + len(list(run))
        if value == 1:
            spans.append((start, end, list(logprobs[start:end]), list(versions[start:end])))
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
    for span_start, _, _, span_versions in spans:
        if span_versions and min(span_versions) < 0:
            first = span_start + next(i for i, v in enumerate(span_versions) if v < 0)
            raise TrajectoryError(
                f"model token {first} has no policy version ({versions[first]!r})"
            )
    return spans


def truncate_spans(spans: list[ModelSpan], length: int) -> list[ModelSpan]:
    """``spans`` cut to a response of ``length`` tokens (new list; spans are not changed)."""
    cut: list[ModelSpan] = []
    for start, end, logprobs, versions in spans:
        if start >= length:
            break
        if end > length:
            keep = length - start
            start, end, logprobs, versions = start, length, logprobs[:keep], versions[:keep]
        cut.append((start, end, logprobs, versions))
    return cut
