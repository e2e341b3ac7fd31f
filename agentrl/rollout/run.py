"""Rollouts without training: run the agent loops over a dataset, score, write JSON lines.

    from agentrl.config import load_config
    from agentrl.rollout import rollout

    result = rollout(load_config("rollout.yaml"), out="trajectories.jsonl", split="val")
    result.metrics["reward/score/mean"], result.failed, result.trajectories[0]["messages"]

    result = await arollout(...)  # the same, from a running event loop (Jupyter, async code)

The command line does the same: ``agentrl rollout CONFIG [overrides] --out FILE``.

``rollout`` imports the config's ``plugins``, reads the dataset (``data.train_files`` or
``data.val_files``, the first ``limit`` rows), starts what a training run starts for
generation (Ray unless already connected, the rollout servers, the gateway when
``gateway.enabled``, ``rollout.num_workers`` agent-loop workers), runs ``rollout.n``
episodes per row with the rollout sampling settings, scores each finished episode with
the configured reward (as the trainers do: the reward function on the decoded response of
the episode's last output, plus the loop's ``tool_reward``), writes it as one JSON line as
soon as it is scored, and stops everything it started, also on error or Ctrl-C.

One line per episode (``trajectory_record``), in the order episodes finish:

- ``episode_id``, ``group_id`` (shared by the ``n`` samples of a row), ``row_index``,
  ``sample_index``, ``agent_name``, ``latency_s``;
- ``messages``: the row's prompt messages, then one message per span of the response:
  ``{"role": "assistant", ...}`` for model tokens (special tokens skipped) and
  ``{"role": "env", ...}`` for the tokens the loop appended (tool results, user turns) as
  the chat template rendered them (special tokens kept);
- ``prompt_ids``, ``response_ids``, ``response_mask`` (1 = model token),
  ``response_logprobs``, ``response_versions`` (policy version per token, -1 for env
  tokens), ``num_turns``, ``metrics`` (the loop's), ``extra`` (the loop's);
- ``reward`` (None for a failed episode), ``reward_info`` (the other entries of a dict
  reward, ``reward_error`` when the reward function failed);
- ``error``: why the episode failed (None when it did not); its token fields are empty;
- ``earlier_samples``: only for loops that return several outputs per episode; the
  fields above describe the last (scored) one, this list the others.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, TypeVar

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agentrl.config import AgentRLConfig, ConfigError, resolve_user_config
from agentrl.core.trajectory import AgentLoopOutput
from agentrl.data import build_dataset, parse_row
from agentrl.reward.manager import RewardManager, RewardRequest, RewardResult, reward_metrics
from agentrl.rollout.episode import EpisodeResult, make_requests
from agentrl.rollout.metrics import episode_info, rollout_metrics

__all__ = ["RolloutResult", "arollout", "episode_messages", "rollout", "trajectory_record"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


@dataclass
class RolloutResult:
    """What ``rollout`` produced: every episode's record and the run's metrics."""

    trajectories: list[dict[str, Any]]
    """One record per episode, as written to ``out`` (see the module docstring)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """``reward/score/mean|min|max``, ``reward/errors``, ``reward/<key>/mean``,
    ``rollout/episodes``, ``rollout/failed_episodes``, ``rollout/num_turns/mean``,
    ``rollout/response_length/mean``, ``rollout/<loop metric>``, ``timing/rollout_s``."""
    out: Path | None = None

    @property
    def failed(self) -> int:
        """Episodes that ended with an error."""
        return sum(r["error"] is not None for r in self.trajectories)


def episode_messages(
    prompt: list[dict[str, Any]], output: AgentLoopOutput, tokenizer: Any
) -> list[dict[str, Any]]:
    """The conversation of ``output``: ``prompt``, then one message per response span
    (``assistant`` for model tokens, ``env`` for tokens the loop appended)."""
    messages = [dict(m) for m in prompt]
    mask, ids = output.response_mask, output.response_ids
    start = 0
    for end in range(1, len(ids) + 1):
        if end < len(ids) and mask[end] == mask[start]:
            continue
        span = ids[start:end]
        if mask[start]:
            text = tokenizer.decode(span, skip_special_tokens=True)
            messages.append({"role": "assistant", "content": text})
        else:
            messages.append({"role": "env", "content": tokenizer.decode(span)})
        start = end
    return messages


def _sample_fields(prompt: list[dict[str, Any]], output: AgentLoopOutput, tokenizer: Any):
    return {
        "messages": episode_messages(prompt, output, tokenizer),
        "prompt_ids": output.prompt_ids,
        "response_ids": output.response_ids,
        "response_mask": output.response_mask,
        "response_logprobs": output.response_logprobs,
        "response_versions": output.response_versions,
        "num_turns": output.num_turns,
        "metrics": output.metrics,
        "extra": output.extra,
    }


_EMPTY_SAMPLE = {
    "prompt_ids": [],
    "response_ids": [],
    "response_mask": [],
    "response_logprobs": [],
    "response_versions": [],
    "num_turns": 0,
    "metrics": {},
    "extra": {},
}


def trajectory_record(
    episode: EpisodeResult,
    row: dict[str, Any],
    tokenizer: Any,
    reward: RewardResult | None,
) -> dict[str, Any]:
    """The JSON-ready record of one episode (see the module docstring)."""
    record: dict[str, Any] = {
        "episode_id": episode.episode_id,
        "group_id": episode.group_id,
        "row_index": episode.row_index,
        "sample_index": episode.sample_index,
        "agent_name": episode.agent_name,
        "latency_s": round(episode.latency_s, 4),
    }
    prompt = row.get("prompt", [])
    if episode.ok and episode.outputs:
        *earlier, last = episode.outputs
        record.update(_sample_fields(prompt, last, tokenizer))
        if earlier:
            record["earlier_samples"] = [_sample_fields(prompt, o, tokenizer) for o in earlier]
    else:
        record.update(messages=[dict(m) for m in prompt], **_EMPTY_SAMPLE)
    if reward is None:
        record.update(reward=None, reward_info={})
    else:
        tool_reward = float(episode.outputs[-1].extra.get("tool_reward", 0.0))
        record.update(reward=reward.score + tool_reward, reward_info=dict(reward.info))
        if reward.error is not None:
            record["reward_info"]["reward_error"] = reward.error
    record["error"] = episode.error if not episode.ok else None
    if episode.ok and not episode.outputs:
        record["error"] = "the agent loop returned no output"
    return record


def _load_rows(
    cfg: AgentRLConfig, split: Literal["train", "val"], limit: int | None, tokenizer: Any
) -> list[dict[str, Any]]:
    files = cfg.data.train_files if split == "train" else cfg.data.val_files
    if not files and cfg.data.custom_cls_path is None:
        other = "val" if split == "train" else "train"
        raise ConfigError(
            f"data.{split}_files is empty: set it (e.g. data.{split}_files=[rows.jsonl])"
            + (f" or roll out the {other} split" if getattr(cfg.data, f"{other}_files") else "")
        )
    rows = build_dataset(files, cfg.data, tokenizer, name=split).rows
    return [r.to_dict() for r in rows[:limit]]


class _Writer:
    """Appends records to the output file (if any) and keeps them."""

    def __init__(self, out: Path | None) -> None:
        self.records: list[dict[str, Any]] = []
        self._file: IO[str] | None = None
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            self._file = out.open("w")

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        if self._file is not None:
            self._file.write(json.dumps(record, default=str) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


async def _run(
    manager: Any,
    rows: list[dict[str, Any]],
    n: int,
    rewards: RewardManager,
    tokenizer: Any,
    writer: _Writer,
    on_episode: Callable[[dict[str, Any]], None],
) -> dict[str, float]:
    requests = make_requests(rows, n, manager.default_sampling())
    episodes: list[EpisodeResult] = []
    scores: list[RewardResult] = []

    async def finish(episode: EpisodeResult) -> None:
        row = rows[episode.row_index]
        reward = None
        if episode.ok and episode.outputs:
            last = episode.outputs[-1]
            text = tokenizer.decode(last.response_ids, skip_special_tokens=True)
            reward = await rewards.score(RewardRequest.from_row(row, text, episode_info(last)))
            scores.append(reward)
        episodes.append(episode)
        record = trajectory_record(episode, row, tokenizer, reward)
        writer.write(record)
        on_episode(record)

    scoring = [
        asyncio.ensure_future(finish(episode))
        async for episode in manager.stream_requests(requests)
    ]
    await asyncio.gather(*scoring)
    ok = [e for e in episodes if e.ok and e.outputs]
    metrics = reward_metrics(scores) if scores else {}
    metrics["rollout/episodes"] = float(len(episodes))
    metrics["rollout/failed_episodes"] = float(len(episodes) - len(ok))
    metrics.update(rollout_metrics(ok))
    return metrics


def _progress(total: int, enabled: bool) -> tuple[Progress, Callable[[dict[str, Any]], None]]:
    progress = Progress(
        TextColumn("[bold]rollout"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"),
        disable=not enabled,
    )
    task = progress.add_task("rollout", total=total, status="")
    counts = {"failed": 0, "scored": 0, "reward": 0.0}

    def on_episode(record: dict[str, Any]) -> None:
        if record["error"] is not None:
            counts["failed"] += 1
        if record["reward"] is not None:
            counts["scored"] += 1
            counts["reward"] += record["reward"]
        mean = counts["reward"] / counts["scored"] if counts["scored"] else float("nan")
        status = f"failed {counts['failed']}  reward {mean:.3f}"
        progress.update(task, advance=1, status=status)

    return progress, on_episode


def rollout(
    config: AgentRLConfig,
    out: str | Path | None = None,
    *,
    split: Literal["train", "val"] = "train",
    limit: int | None = None,
    rows: list[dict[str, Any]] | None = None,
    progress: bool = True,
) -> RolloutResult:
    """Run ``config.rollout.n`` episodes per dataset row, score them, write JSON lines.

    Args:
        config: the whole configuration (``model``, ``server``, ``rollout``, ``reward``,
            ``data``, ``plugins``, ...); not modified.
        out: the JSONL file to write (replaced); None writes nothing.
        split: ``train`` reads ``data.train_files``, ``val`` reads ``data.val_files``.
        limit: roll out only the first ``limit`` rows (after length filtering).
        rows: dataset rows to use instead of the files (validated like file rows).
        progress: show a progress bar on the console.

    Returns the records (also those of failed episodes) and the run's metrics. Raises
    ``ConfigError`` for a config that cannot run, ``PluginError`` for a plugin that does
    not import; a failing episode is a record with an ``error``, never an exception.

    Runs an event loop of its own: from code whose loop is already running (Jupyter,
    async applications) use ``await arollout(...)``.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(
            arollout(config, out, split=split, limit=limit, rows=rows, progress=progress)
        )
    raise RuntimeError(
        "rollout() runs an event loop of its own and cannot be called from a running one "
        "(Jupyter, async code): use `await arollout(...)` there (same arguments)"
    )


async def arollout(
    config: AgentRLConfig,
    out: str | Path | None = None,
    *,
    split: Literal["train", "val"] = "train",
    limit: int | None = None,
    rows: list[dict[str, Any]] | None = None,
    progress: bool = True,
) -> RolloutResult:
    """``rollout`` as a coroutine, for a running event loop: ``await arollout(config, ...)``.

    Same arguments, result and errors as ``rollout``. The blocking steps (loading the
    tokenizer, the rows and the plugins, starting and stopping Ray, the servers and the
    agent-loop workers) run in a worker thread, so the loop keeps serving its other tasks.
    """
    if limit is not None and limit < 1:
        raise ConfigError(f"limit must be at least 1, got {limit}")
    cfg, tokenizer, dataset = await _in_thread(_prepare, config, split, limit, rows)
    out_path = Path(out) if out is not None else None
    total = len(dataset) * cfg.rollout.n
    logger.info(
        "rolling out %d row(s) x %d sample(s) with %s", len(dataset), cfg.rollout.n, cfg.model.path
    )
    start = time.perf_counter()
    rewards = RewardManager.from_config(cfg.reward, cfg.model, cfg.server)
    writer = _Writer(out_path)
    bar, on_episode = _progress(total, progress)
    generation = _Generation(cfg)
    try:
        generation.start_ray()  # here: Ray sets its signal handlers from the main thread only
        manager = await _in_thread(generation.start)
        with bar:
            metrics = await _run(
                manager, dataset, cfg.rollout.n, rewards, tokenizer, writer, on_episode
            )
    finally:
        await _in_thread(generation.stop)
        writer.close()
        rewards.close()
    metrics["timing/rollout_s"] = time.perf_counter() - start
    return RolloutResult(trajectories=writer.records, metrics=metrics, out=out_path)


def _prepare(
    config: AgentRLConfig,
    split: Literal["train", "val"],
    limit: int | None,
    rows: list[dict[str, Any]] | None,
) -> tuple[AgentRLConfig, Any, list[dict[str, Any]]]:
    """The resolved config (plugins imported), the tokenizer and the rows to roll out."""
    from transformers import AutoTokenizer

    if not config.model.path:
        raise ConfigError("model.path is required (an HF id, a directory or builtin:<name>)")
    cfg = resolve_user_config(config.model_copy(deep=True))
    tokenizer = AutoTokenizer.from_pretrained(
        cfg.model.tokenizer, trust_remote_code=cfg.model.trust_remote_code
    )
    if rows is not None:
        dataset = [parse_row(row, f"rows[{i}]").to_dict() for i, row in enumerate(rows)][:limit]
    else:
        dataset = _load_rows(cfg, split, limit, tokenizer)
    return cfg, tokenizer, dataset


async def _in_thread(fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)`` in a worker thread; if the caller is cancelled meanwhile (Ctrl-C),
    ``fn`` still finishes before the cancellation goes on, so cleanup sees what it did."""
    task = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        raise


class _Generation:
    """Ray (unless already connected), rollout servers, gateway, agent-loop workers;
    ``stop`` stops what was started, in reverse order."""

    def __init__(self, cfg: AgentRLConfig) -> None:
        self.cfg = cfg
        self._undo: list[Callable[[], None]] = []

    def start_ray(self) -> None:
        """Start a local Ray instance (or connect to ``ray.address``) unless connected."""
        import ray

        from agentrl.server.launch import init_ray

        if not ray.is_initialized():
            init_ray(self.cfg.ray)
            # No serve.shutdown first: the rollout app is deleted by then, and Ray's
            # shutdown stops a local instance's Serve controller with it (a cluster's is
            # left to the others it serves). serve.shutdown awaits a call that the
            # controller answers only by killing itself, which Ray reports as a failed
            # task ("ServeController.graceful_shutdown failed ... will be retried").
            self._undo.append(ray.shutdown)

    def start(self) -> Any:
        """The servers, the gateway if enabled, and the workers; returns the manager."""
        from agentrl.placement import rollout_actor_resources
        from agentrl.rollout.manager import AgentLoopManager
        from agentrl.server.launch import start_rollout_servers, stop_rollout_servers

        cfg = self.cfg
        start_rollout_servers(cfg.model, cfg.server, rollout_actor_resources(cfg.placement.rollout))
        self._undo.append(lambda: stop_rollout_servers(cfg.server))
        if cfg.gateway.enabled:  # loops with agent_name: external call it
            from agentrl.server.gateway.deployment import start_gateway, stop_gateway

            start_gateway(cfg.gateway, cfg.model, cfg.server)
            self._undo.append(lambda: stop_gateway(cfg.gateway))
        manager = AgentLoopManager(cfg)
        self._undo.append(manager.shutdown)
        return manager

    def stop(self) -> None:
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception:
                logger.exception("rollout: cleanup step %s failed", undo)
