"""Score batches of responses concurrently, off the event loop, never failing the batch.

    manager = RewardManager.from_config(cfg.reward)
    batch = await manager.score_batch(
        [RewardRequest.from_row(row, text) for row, text in zip(rows, responses)]
    )
    batch.scores, batch.metrics  # {"reward/score/mean": ..., "reward/errors": 0, ...}

A reward function that raises, returns something that is not a finite number or a dict
with a finite ``"score"``, or runs past ``timeout_s`` gives reward 0.0; the batch metrics
count these as ``reward/errors`` and ``reward/timeouts``.

Metrics: ``reward/score/mean|min|max``, ``reward/errors``, ``reward/timeouts``, and
``reward/<key>/mean`` for every numeric entry of dict results (``reward/acc/mean``).

With ``reward.judge.enabled`` an LLM judge scores each response (``agentrl.reward.judge``):
the reward is ``judge.weight x judge score + judge.fn_weight x function score`` (the
function is not called when ``fn_weight`` is 0). A judge verdict that cannot be read or
that times out is a failed reward like a failing function: 0.0, with its ``error``
(``judge: ...``), counted in ``reward/errors`` or ``reward/timeouts``. Successful judged
results carry ``judge`` (the score in [0, 1]) and ``judge_cached`` in their info, hence the
metrics ``reward/judge/mean`` and ``reward/judge_cached/mean`` (the cache-hit rate).
"""

from __future__ import annotations

import asyncio
import logging
import math
import numbers
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl.core.config import ModelConfig
from agentrl.data.row import DatasetRow
from agentrl.reward.builtin import ScoreFn, default_compute_score
from agentrl.reward.config import RewardConfig
from agentrl.reward.judge import RewardJudge, Verdict
from agentrl.reward.loader import RewardFnRef, load_reward_fn
from agentrl.reward.runners import ProcessRunner, ThreadRunner
from agentrl.server.config import ServerConfig

__all__ = ["RewardBatch", "RewardManager", "RewardRequest", "RewardResult", "reward_metrics"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RewardRequest:
    """The four arguments of one reward call, and the row's prompt (what a judge reads)."""

    data_source: str
    solution_str: str
    ground_truth: Any
    extra_info: dict[str, Any] = field(default_factory=dict)
    prompt: Any = field(default=None, compare=False)
    """The row's ``prompt`` (chat messages or text), which a judge reads; None when not
    known. Not part of equality: requests are equal when their four arguments are."""

    @classmethod
    def from_row(
        cls,
        row: DatasetRow | Mapping[str, Any],
        solution_str: str,
        episode_info: Mapping[str, Any] | None = None,
    ) -> RewardRequest:
        """A request for ``row`` (a ``DatasetRow`` or its dict form) and a response text.

        ``episode_info`` (how the episode went: turns, tool-call counts) is added to the
        row's ``extra_info``, over any entries of the same name.
        """
        data = row.to_dict() if isinstance(row, DatasetRow) else row
        return cls(
            data_source=data["data_source"],
            solution_str=solution_str,
            ground_truth=(data.get("reward_model") or {}).get("ground_truth"),
            extra_info={**(data.get("extra_info") or {}), **(episode_info or {})},
            prompt=data.get("prompt"),
        )


@dataclass(frozen=True)
class RewardResult:
    """One call's reward, the other entries of a dict result, and what went wrong if any."""

    score: float
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    timed_out: bool = False


@dataclass(frozen=True)
class RewardBatch:
    """Results in request order, and the batch's metrics."""

    results: list[RewardResult]
    metrics: dict[str, float]

    @property
    def scores(self) -> list[float]:
        """The reward of every request, in order."""
        return [r.score for r in self.results]


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and math.isfinite(float(value))


def _to_result(raw: Any) -> RewardResult:
    if isinstance(raw, Mapping):
        if "score" not in raw or not _is_number(raw["score"]):
            return RewardResult(0.0, error=f"dict result needs a finite 'score', got {raw!r}")
        info = {k: v for k, v in raw.items() if k != "score"}
        return RewardResult(float(raw["score"]), info=info)
    if _is_number(raw):
        return RewardResult(float(raw))
    return RewardResult(0.0, error=f"returned {raw!r}; expected a finite float or a dict")


def reward_metrics(results: Sequence[RewardResult]) -> dict[str, float]:
    """The batch metrics of ``results`` (see the module docstring)."""
    scores = [r.score for r in results]
    metrics = {
        "reward/score/mean": sum(scores) / len(scores) if scores else 0.0,
        "reward/score/min": min(scores, default=0.0),
        "reward/score/max": max(scores, default=0.0),
        "reward/errors": float(sum(r.error is not None and not r.timed_out for r in results)),
        "reward/timeouts": float(sum(r.timed_out for r in results)),
    }
    values: dict[str, list[float]] = {}
    for result in results:
        for key, value in result.info.items():
            if _is_number(value):
                values.setdefault(key, []).append(float(value))
    for key, vals in values.items():
        metrics[f"reward/{key}/mean"] = sum(vals) / len(vals)
        if len(vals) > 1:
            # Standard error of the mean (validation prints accuracy ± this).
            metrics[f"reward/{key}/se"] = statistics.stdev(vals) / math.sqrt(len(vals))
    return metrics


class RewardManager:
    """Runs a reward function on many responses at once, in threads or processes.

    ``fn`` is a callable, a ``RewardFnRef`` (required for user files in process mode: the
    workers import it themselves) or None for the built-in scorers. At most
    ``num_workers`` calls run at a time; each has ``timeout_s`` seconds. ``judge``: an
    LLM judge whose score, times ``judge.config.weight``, is the reward, plus the
    function's times ``judge.config.fn_weight`` (see the module docstring).
    """

    def __init__(
        self,
        fn: ScoreFn | RewardFnRef | None = None,
        *,
        executor: Literal["thread", "process"] = "thread",
        num_workers: int = 4,
        timeout_s: float = 30.0,
        judge: RewardJudge | None = None,
    ) -> None:
        if num_workers < 1 or timeout_s <= 0:
            raise ValueError(
                f"need num_workers >= 1 and timeout_s > 0, got {num_workers}, {timeout_s}"
            )
        if executor == "thread" and isinstance(fn, RewardFnRef):
            fn = fn.resolve()
        self._target = default_compute_score if fn is None else fn
        self.executor = executor
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self._processes = ProcessRunner(num_workers) if executor == "process" else None
        self._threads = ThreadRunner()
        self._slots: asyncio.Semaphore | None = None
        self.judge = judge

    @classmethod
    def from_config(
        cls,
        config: RewardConfig,
        model: ModelConfig | None = None,
        server: ServerConfig | None = None,
    ) -> RewardManager:
        """Build from the ``reward`` config section (loading the user function, if any).

        ``model`` and ``server``: the policy's sections, which the judge
        (``reward.judge.enabled``) starts from; its servers start at the first score."""
        judge = None
        if config.judge.enabled:
            judge = RewardJudge.from_config(
                config.judge, model or ModelConfig(), server or ServerConfig()
            )
        fn: RewardFnRef | None = None
        if config.reward_fn_path is not None:
            load_reward_fn(config.reward_fn_path, config.reward_fn_name)  # fail fast here
            fn = RewardFnRef(config.reward_fn_path, config.reward_fn_name)
        return cls(
            fn,
            executor=config.executor,
            num_workers=config.num_workers,
            timeout_s=config.timeout_s,
            judge=judge,
        )

    async def _call(self, request: RewardRequest) -> Any:
        kwargs = {
            "data_source": request.data_source,
            "solution_str": request.solution_str,
            "ground_truth": request.ground_truth,
            "extra_info": request.extra_info,
        }
        if self._processes is not None:
            return await self._processes.run(self._target, kwargs, self.timeout_s)
        return await self._threads.run(self._target, kwargs, self.timeout_s)

    async def score(self, request: RewardRequest) -> RewardResult:
        """Score one response; errors and timeouts give 0.0 and are recorded, not raised.

        A group judge judges it as a group of one."""
        if self.judge is not None:
            return (await self._judged([request]))[0]
        return await self._score_fn(request)

    async def _score_fn(self, request: RewardRequest) -> RewardResult:
        """The reward function's result for one request."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.num_workers)
        async with self._slots:
            try:
                raw = await self._call(request)
            except TimeoutError:
                logger.warning(
                    "reward for %s timed out after %.1fs", request.data_source, self.timeout_s
                )
                return RewardResult(0.0, error=f"timed out after {self.timeout_s}s", timed_out=True)
            except Exception as exc:
                message = f"{type(exc).__name__}: {exc}"
                logger.warning("reward for %s failed: %s", request.data_source, message)
                return RewardResult(0.0, error=message)
        result = _to_result(raw)
        if result.error is not None:
            logger.warning("reward for %s: %s", request.data_source, result.error)
        return result

    async def score_batch(self, requests: Sequence[RewardRequest]) -> RewardBatch:
        """Score all ``requests`` concurrently; results keep the request order. A group
        judge judges together the requests that share their prompt and ground truth."""
        if self.judge is not None:
            results = await self._judged(requests)
        else:
            results = list(await asyncio.gather(*(self._score_fn(r) for r in requests)))
        return RewardBatch(results=results, metrics=reward_metrics(results))

    async def _judged(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        """The judge's verdicts (and the function's results, when weighted in) combined."""
        assert self.judge is not None
        config = self.judge.config
        calls = [self.judge.judge(requests)]
        if config.fn_weight:
            calls.append(asyncio.gather(*(self._score_fn(r) for r in requests)))
        verdicts, *fn_results = await asyncio.gather(*calls)
        if not fn_results:
            return [_judge_result(v, config.weight, None, 0.0) for v in verdicts]
        return [
            _judge_result(v, config.weight, fn, config.fn_weight)
            for v, fn in zip(verdicts, fn_results[0], strict=True)
        ]

    def close(self) -> None:
        """Stop the worker processes (process mode) and the judge's servers; the manager
        can still be used after (the judge's servers start again at the next score)."""
        if self._processes is not None:
            self._processes.close()
        if self.judge is not None:
            self.judge.close()


def _judge_result(
    verdict: Verdict, weight: float, fn: RewardResult | None, fn_weight: float
) -> RewardResult:
    """One reward from a judge verdict and, when weighted in, the function's result: a
    failure of either is the reward's failure."""
    if verdict.score is None:  # the judge logged why, once per call
        return RewardResult(
            0.0,
            info={"judge_output": verdict.output},
            error=f"judge: {verdict.error}",
            timed_out=verdict.timed_out,
        )
    info: dict[str, Any] = {"judge": verdict.score, "judge_cached": float(verdict.cached)}
    if fn is None:
        return RewardResult(weight * verdict.score, info=info)
    if fn.error is not None:
        return fn
    return RewardResult(
        weight * verdict.score + fn_weight * fn.score,
        info={**fn.info, "fn_score": fn.score, **info},
    )
