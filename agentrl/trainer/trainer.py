"""``Trainer``: the synchronous fit loop on Ray (single controller, FSDP2 workers).

    generate → reward → old log-probs → reference → advantages → update → push weights

``AsyncTrainer`` (``async_trainer.py``) overlaps generation with training; both share
the parts below.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from transformers import AutoTokenizer

from agentrl.algos import DynamicSampler, DynamicSamplingError, KLController
from agentrl.config import AgentRLConfig, resolve_user_config
from agentrl.core.types import INITIAL_WEIGHT_VERSION, SamplingParams
from agentrl.data.dataset import build_dataset
from agentrl.data.loader import RowLoader
from agentrl.placement import rollout_actor_resources
from agentrl.preflight import check_algorithm, check_inputs
from agentrl.reward.manager import RewardManager
from agentrl.rollout.episode import EpisodeRequest, EpisodeResult, make_requests
from agentrl.rollout.manager import AgentLoopManager
from agentrl.server.client import ServerClient
from agentrl.server.gateway.deployment import start_gateway, stop_gateway
from agentrl.server.launch import init_ray, start_rollout_servers, stop_rollout_servers
from agentrl.server.weight_transport import make_weight_sync
from agentrl.tracking import MetricsLogger
from agentrl.trainer.audit import RowAudit
from agentrl.trainer.batch import Sample, build_batch
from agentrl.trainer.checkpoint import CRITIC_DIR, TRAINER_STATE_FILE
from agentrl.trainer.dispatch import Batch
from agentrl.trainer.group import ActorGroup, CriticGroup, ReferenceGroup
from agentrl.trainer.losses import make_actor_loss, make_critic_loss
from agentrl.trainer.resume import CONFIG_FILE, check_resume
from agentrl.trainer.samples import write_samples
from agentrl.trainer.sim import sim_groups
from agentrl.trainer.steps import (
    add_advantages,
    apply_rollout_correction,
    mismatch_metrics,
    mismatch_probe,
    probe_batch,
    probe_prompts,
    sample_groups,
    sampled,
    score_episodes,
    staleness_metrics,
)

logger = logging.getLogger(__name__)

NOT_TRAINED = "not trained: uninformative (dynamic sampling), failed, or too few samples"

_REPLICA_STATS_TIMEOUT_S = 30.0
_MAX_CATCH_UP_PUSHES = 3
"""Pushes of one version to replicas that came back without it, before the run stops."""


@contextmanager
def timer(metrics: dict[str, float], name: str):
    """Add the block's wall time to ``metrics["timing/<name>"]``."""
    start = time.perf_counter()
    yield
    metrics[f"timing/{name}"] = metrics.get(f"timing/{name}", 0.0) + time.perf_counter() - start


class Trainer:
    """Owns the rollout servers, agent-loop workers, FSDP workers and the data."""

    def __init__(self, cfg: AgentRLConfig) -> None:
        self.cfg = cfg
        self.run_dir = Path(cfg.trainer.run_dir)
        self.step = 0
        self.version = INITIAL_WEIGHT_VERSION
        self.trained_episodes: set[str] = set()
        self._step_rows: set[int] = set()  # rows the synchronous step handed out
        self._catch_up_pushes: dict[int, int] = {}  # version -> pushes to lagging replicas
        # Set by setup() for the algorithm that needs them.
        self.actor: ActorGroup | None = None
        self.ref: ReferenceGroup | None = None
        self.critic: CriticGroup | None = None
        self.kl_controller: KLController | None = None
        # What setup() has started so far, so that shutdown() stops only that.
        self.manager: AgentLoopManager | None = None
        self.rewards: RewardManager | None = None
        self.tracker: MetricsLogger | None = None
        self.audit: RowAudit | None = None
        self._servers_started = False
        self._gateway_started = False

    # -- setup -------------------------------------------------------------------------

    def setup(self) -> None:
        """Start Ray, the rollout servers, the agent-loop and training workers, and
        restore the run directory's last checkpoint (``trainer.resume``).

        Raises:
            ResumeMismatch: the run directory holds another run's checkpoint.
            RunFinished: its last checkpoint is at ``trainer.total_steps``.
            Both before anything starts (``agentrl.trainer.resume``).
            MissingInputs: a data file, the model directory, the critic's checkpoint, the
                tool or reward file does not exist; also before anything starts
                (``agentrl.preflight``).
            UnsupportedAlgorithm: an advantage estimator or loss mode that is not
                registered, or one the trainer cannot feed; before anything starts.

        Any other failure stops what had started (servers, gateway, workers) before it
        propagates, so a failed setup leaves no Serve application holding its devices.
        """
        self.cfg = cfg = resolve_user_config(self.cfg)
        checkpoint = check_resume(cfg)  # before the run directory's config is replaced
        check_inputs(cfg, [*cfg.data.train_files, *cfg.data.val_files])
        check_algorithm(cfg)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / CONFIG_FILE).write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer)
        self.val_rows = (
            [r.to_dict() for r in build_dataset(cfg.data.val_files, cfg.data, self.tokenizer).rows]
            if cfg.data.val_files
            else []
        )
        self.loader = self._row_loader()
        init_ray(cfg.ray)
        try:
            self._start(checkpoint)
        except BaseException:
            for failure in self._stop_started():
                logger.error("stopping after a failed setup: %r", failure)
            raise

    def _start(self, checkpoint: Path | None) -> None:
        """Everything ``setup`` starts on Ray, in order; ``_stop_started`` undoes it."""
        cfg = self.cfg
        # The replicas and the training ranks start at once: a vLLM replica imports vLLM
        # in three processes one after the other, which alone leaves a core idle.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-start") as pool:
            rollout_start = pool.submit(self._start_rollout_servers)
            self._start_training_workers()  # on failure, raises once the servers are up
        self.client = rollout_start.result()
        self.manager = AgentLoopManager(cfg)
        kl = cfg.algorithm.kl
        self.kl_controller = kl.make_controller() if kl.use_kl_in_reward else None
        self.rewards = RewardManager.from_config(cfg.reward, cfg.model, cfg.server)
        self.loss_fn = make_actor_loss(cfg.algorithm)
        self.critic_loss_fn = make_critic_loss(cfg.algorithm)
        self.sync = make_weight_sync(cfg.weight_sync, self.client.control)
        self.tracker = MetricsLogger.from_config(
            self.run_dir, cfg.logging, total_steps=cfg.trainer.total_steps
        )
        if checkpoint is not None:
            self._resume(checkpoint)
        self.audit = RowAudit(self.run_dir, self.step if checkpoint is not None else None)

    def _start_rollout_servers(self) -> ServerClient:
        """The rollout replicas, and the gateway in front of them when enabled."""
        cfg = self.cfg
        self._servers_started = True  # a deployment that fails half-way is deleted too
        client = start_rollout_servers(
            cfg.model, cfg.server, rollout_actor_resources(cfg.placement.rollout)
        )
        if cfg.gateway.enabled:  # external agents (agent_name: external) call it
            self._gateway_started = True
            start_gateway(cfg.gateway, cfg.model, cfg.server)
        return client

    def _start_training_workers(self) -> None:
        """The FSDP ranks: actor, reference (when a KL term needs it), critic (GAE)."""
        cfg = self.cfg
        kl = cfg.algorithm.kl
        if cfg.workers.backend == "sim":  # modeled GPU time, no ranks (agentrl.trainer.sim)
            self.actor, self.ref, self.critic = sim_groups(
                cfg,
                with_ref=kl.use_kl_loss or kl.use_kl_in_reward,
                with_critic=cfg.algorithm.adv_estimator == "gae",
            )
            return
        total = cfg.trainer.total_steps
        placement = cfg.placement.trainer
        self.actor = ActorGroup(
            cfg.workers.actor, cfg.model.path, total_training_steps=total, placement=placement
        )
        kl = cfg.algorithm.kl
        self.ref = (
            ReferenceGroup(cfg.workers.ref, cfg.model.path, placement=placement)
            if kl.use_kl_loss or kl.use_kl_in_reward
            else None
        )
        critic_cfg = cfg.workers.critic
        self.critic = (
            CriticGroup(
                critic_cfg, critic_cfg.model_path or cfg.model.path, total_training_steps=total
            )
            if cfg.algorithm.adv_estimator == "gae"
            else None
        )

    def _stop_training_workers(self) -> None:
        """Stop the FSDP ranks that ``_start_training_workers`` started."""
        for group in (self.actor, self.ref, self.critic):
            if group is not None:
                group.shutdown()

    def _row_loader(self) -> RowLoader | None:
        """The training rows; None when only gateway sessions are trained on (async)."""
        cfg = self.cfg
        if not cfg.trainer.agent_loop_episodes and not cfg.data.train_files:
            return None
        train = build_dataset(cfg.data.train_files, cfg.data, self.tokenizer, name="train")
        return RowLoader(
            [r.to_dict() for r in train.rows],
            cfg.data.train_batch_size,
            shuffle=cfg.data.shuffle,
            seed=cfg.data.seed,
            drop_last=cfg.data.drop_last,
        )

    def shutdown(self) -> None:
        """Stop every worker and the rollout servers. Every stop is tried; the first
        that failed is raised after the rest (the others are logged)."""
        failures = self._stop_started()
        for failure in failures[1:]:
            logger.error("stopping: %r", failure)
        if failures:
            raise failures[0]

    def _stop_started(self) -> list[Exception]:
        """Stop, in order, what ``setup`` has started (all of it after a full setup);
        returns the stops that failed."""
        cfg = self.cfg
        stops: list[Callable[[], object]] = [
            part.close for part in (self.audit, self.tracker, self.rewards) if part is not None
        ]
        if self.manager is not None:
            stops.append(self.manager.shutdown)
        stops.append(self._stop_training_workers)
        if self._gateway_started:
            stops.append(lambda: stop_gateway(cfg.gateway))
        if self._servers_started:
            stops.append(lambda: stop_rollout_servers(cfg.server))
        failures = []
        for stop in stops:
            try:
                stop()
            except Exception as failure:  # the next stop must still run
                failures.append(failure)
        self.audit = self.tracker = self.rewards = self.manager = None
        self.actor = self.ref = self.critic = None
        self._gateway_started = self._servers_started = False
        return failures

    # -- the loop ----------------------------------------------------------------------

    async def fit(self) -> list[dict[str, float]]:
        """Train ``trainer.total_steps`` steps and save a checkpoint; returns each step's
        logged metrics. The rollout client's data path (the mismatch probe's generate
        calls) routes on this event loop until the steps end."""
        async with self.client:
            history = await self.train_steps()
        if not self._checkpoint_due():  # else the loop stopped early, just after one
            self.save_checkpoint()
        return history

    async def train_steps(self) -> list[dict[str, float]]:
        """The synchronous fit loop: generate a batch, train on it, push the weights."""
        if self.loader is None:
            raise ValueError(
                "trainer.agent_loop_episodes=false (gateway sessions only) needs the async "
                "trainer (`agentrl train` without --sync)"
            )
        history = []
        await self.serve_restored_weights()
        await self._maybe_validate(force=True)
        while self.step < self.cfg.trainer.total_steps:
            metrics: dict[str, float] = {}
            with timer(metrics, "step"):
                await self.keep_replicas_current()
                rows = self.loader.next_batch()
                self._step_rows = set()
                with timer(metrics, "gen"):
                    episodes, row_of = await self.generate(rows)
                metrics |= await self.train_on(episodes, row_of, metrics)
                # Rows whose episodes all failed, and dynamic sampling's extra rows it
                # did not keep.
                self.audit.drop_unsettled(self._step_rows, NOT_TRAINED)
            history.append(await self._finish_step(metrics))
        return history

    async def generate(
        self, rows: list[dict[str, Any]]
    ) -> tuple[list[EpisodeResult], dict[str, dict[str, Any]]]:
        """``rollout.n`` episodes per row with the current policy."""
        requests = make_requests(
            rows,
            self.cfg.rollout.n,
            self.manager.default_sampling(),
            # Unique over the run, dynamic sampling's extra batches included: the row
            # index seeds each episode's sampling and keys the audit.
            first_row_index=self.loader.rows_drawn - len(rows),
        )
        for request in requests:
            if request.sample_index == 0:
                self.audit.handed_out(request.row_index, request.group_id)
                self._step_rows.add(request.row_index)
        episodes = [e async for e in self.manager.stream_requests(requests)]
        return episodes, _rows_by_group(requests)

    async def train_on(
        self,
        episodes: list[EpisodeResult],
        row_of: dict[str, dict[str, Any]],
        metrics: dict[str, float],
    ) -> dict[str, float]:
        """Reward → batch → log-probs → advantages → update → push weights."""
        episodes = sorted(episodes, key=lambda e: (e.row_index, e.sample_index))
        repeated = self.trained_episodes.intersection(e.episode_id for e in episodes)
        if repeated:
            raise RuntimeError(f"episodes delivered twice to the trainer: {sorted(repeated)[:5]}")
        self.trained_episodes.update(e.episode_id for e in episodes)
        metrics["trainer/episodes"] = float(len(episodes))
        with timer(metrics, "reward"):
            samples, reward_metrics = await score_episodes(
                episodes, row_of, self.rewards, self.tokenizer
            )
        metrics |= reward_metrics
        if self.cfg.algorithm.dynamic_sampling.enable:
            samples = await self.informative(samples, metrics)
        if len(samples) < self.cfg.workers.actor.world_size:
            logger.warning(
                "step %d: only %d usable samples, skipping update", self.step, len(samples)
            )
            self.audit.drop_unsettled(_rows_of(episodes), NOT_TRAINED)
            return metrics
        self._save_samples(samples)
        batch, group_ids = build_batch(samples, self.tokenizer.pad_token_id)
        metrics |= staleness_metrics(batch, self.version)
        with timer(metrics, "old_log_prob"):
            metrics |= await self._behaviour_log_probs(batch)
        if self.ref is not None:
            with timer(metrics, "ref"):
                batch["ref_log_probs"] = (
                    await asyncio.to_thread(self.ref.compute_log_prob, batch)
                )["log_probs"]
        if self.critic is not None:
            with timer(metrics, "values"):
                batch["values"] = (await asyncio.to_thread(self.critic.compute_values, batch))[
                    "values"
                ]
        metrics |= add_advantages(
            batch,
            group_ids,
            self.cfg.algorithm,
            self.cfg.rollout.max_response_length,
            self.kl_controller,
        )
        with timer(metrics, "train"):
            if self.critic is not None:
                metrics |= await asyncio.to_thread(
                    self.critic.update_critic, batch, self.critic_loss_fn
                )
            metrics |= await asyncio.to_thread(
                self.actor.update_actor,
                batch,
                self.loss_fn,
                with_entropy=True,
                entropy_grad=self.cfg.algorithm.kl.entropy_coeff > 0,
            )
        self.audit.trained(
            self.step + 1,
            {s.row_index for s in samples if s.row_index >= 0},
            sorted({s.episode_id for s in samples}),
        )
        self.audit.drop_unsettled(_rows_of(episodes), NOT_TRAINED)
        with timer(metrics, "weight_sync"):
            metrics |= await self.push_weights()
        if self._probe_due():
            with timer(metrics, "mismatch_probe"):
                metrics |= await self.probe_mismatch(samples)
        return metrics

    async def informative(self, samples: list[Sample], metrics: dict[str, float]) -> list[Sample]:
        """DAPO dynamic sampling: keep groups whose scores differ, generating more rows
        until ``train_batch_size`` groups are kept or ``max_num_gen_batches`` is reached
        (then the step goes on with the groups kept so far, with a warning)."""
        sampler: DynamicSampler[list[Sample]] = DynamicSampler(
            num_groups=self.cfg.data.train_batch_size,
            max_num_gen_batches=self.cfg.algorithm.dynamic_sampling.max_num_gen_batches,
        )
        try:
            sample_groups(sampler, samples)
            while not sampler.is_full:
                episodes, row_of = await self.generate(self.loader.next_batch())
                more, _ = await score_episodes(episodes, row_of, self.rewards, self.tokenizer)
                sample_groups(sampler, more)
        except DynamicSamplingError as error:
            logger.warning("step %d: %s", self.step + 1, error)
        return sampled(sampler, metrics)

    async def serve_restored_weights(self) -> None:
        """After a resume the servers still hold the initial weights: push the restored
        ones, labelled with the restored version, before anything is generated."""
        if self.version != INITIAL_WEIGHT_VERSION:
            await self.sync.push_from(self.actor, self.version)
            logger.info("pushed the restored weights (version %d) to the servers", self.version)

    async def keep_replicas_current(self) -> None:
        """Push the current weights again when a replica serves an older version: Serve
        restarts a replica that died with the initial weights (version 0), and everything
        it samples would be stale. Call only between steps (the actor holds
        ``self.version``)."""
        if self.version == INITIAL_WEIGHT_VERSION:
            return
        try:
            stats = await asyncio.wait_for(self.client.control.stats(), _REPLICA_STATS_TIMEOUT_S)
        except Exception as error:  # no answer in time (e.g. Serve is redeploying): next time
            logger.info("could not read the replicas' weight versions: %s", error)
            return
        lagging = {
            s.get("replica_id", "?"): s["weight_version"]
            for s in stats
            if s["weight_version"] < self.version
        }
        if not lagging:
            return
        pushes = self._catch_up_pushes.get(self.version, 0)
        if pushes >= _MAX_CATCH_UP_PUSHES:
            raise RuntimeError(
                f"rollout replicas {lagging} still serve weights older than version "
                f"{self.version} after {pushes} pushes of it: they keep restarting or "
                "failing to load them (see the replica logs in the Ray session directory)"
            )
        self._catch_up_pushes = {self.version: pushes + 1}
        logger.warning(
            "replicas serve weights older than version %d (restarted?): %s; pushing "
            "version %d again",
            self.version,
            lagging,
            self.version,
        )
        await self.sync.push_from(self.actor, self.version)

    async def push_weights(self) -> dict[str, float]:
        """Send the actor's weights to every rollout replica as the next version."""
        self.version += 1
        timings = await self.sync.push_from(self.actor, self.version)
        return timings.metrics()

    async def _behaviour_log_probs(self, batch: Batch) -> dict[str, float]:
        if self.cfg.trainer.old_log_probs == "rollout":
            batch["old_log_probs"] = batch["rollout_log_probs"].clone()
            return {}
        out = await asyncio.to_thread(self.actor.compute_log_prob, batch)
        batch["old_log_probs"] = out["log_probs"]
        return apply_rollout_correction(batch, self.cfg.algorithm)

    def _probe_due(self) -> bool:
        """With the rollout's log-probs as behaviour policy nothing is recomputed: the
        mismatch is probed every ``trainer.mismatch_probe_every`` steps instead."""
        every = self.cfg.trainer.mismatch_probe_every
        rollout = self.cfg.trainer.old_log_probs == "rollout"
        return rollout and every > 0 and self.step % every == 0

    async def probe_mismatch(self, samples: list[Sample]) -> dict[str, float]:
        """The rollout/training mismatch of the version just pushed (``mismatch/``
        metrics): the replicas answer a few of the step's prompts, and the actor, which
        holds that version, recomputes the log-probs of exactly those tokens.

        The batch cannot serve: at η ≥ 1 its tokens come from older versions, which
        differ from the actor's by the policy change as well. The probe's requests go to
        the replicas directly, not through the agent loops, so they are never trained.
        """
        rows = max(self.cfg.trainer.mismatch_probe_rows, self.actor.world_size)
        prompts = probe_prompts(samples, rows)
        sampling = self.manager.default_sampling()
        answers = await asyncio.gather(
            *(self.client.data.generate(None, prompt, sampling) for prompt in prompts),
            return_exceptions=True,
        )
        answered = [
            (prompt, answer)
            for prompt, answer in zip(prompts, answers, strict=True)
            if not isinstance(answer, BaseException)
        ]
        if len(answered) < len(answers):
            failure = next(a for a in answers if isinstance(a, BaseException))
            logger.warning(
                "step %d: %d of %d mismatch-probe requests failed: %r",
                self.step + 1,
                len(answers) - len(answered),
                len(answers),
                failure,
            )
        batch = probe_batch(answered, self.tokenizer.pad_token_id)
        # Tokens of a replica that missed the push (restarted) are left out.
        probe = None if batch is None else mismatch_probe(batch, self.version, rows)
        if probe is None or probe["input_ids"].shape[0] < self.actor.world_size:
            logger.warning("step %d: no mismatch probe (too few answers)", self.step + 1)
            return {}
        out = await asyncio.to_thread(self.actor.compute_log_prob, probe)
        return mismatch_metrics(probe, out["log_probs"])

    async def _finish_step(self, metrics: dict[str, float]) -> dict[str, float]:
        self.step += 1
        metrics["trainer/version"] = float(self.version)
        await self._maybe_validate()
        # The line before the checkpoint: a driver killed between the two then trains and
        # logs this step again on resume (the later line wins), instead of resuming past
        # a step that metrics.jsonl never recorded.
        logged = self.tracker.log(self.step, metrics)
        if self._checkpoint_due():
            self.save_checkpoint()
        return logged

    def _checkpoint_due(self) -> bool:
        """Whether ``trainer.save_every`` asks for a checkpoint at this step, in the loop.

        Never at the last step: ``fit`` writes that one after the loop, once the async
        trainer's producer has stopped. Written in the loop, it raced the producer, whose
        next rows (handed out for a step the run never trains) could land after it in the
        audit, and the audit then read a completed run as one that lost them."""
        every = self.cfg.trainer.save_every
        last = self.step >= self.cfg.trainer.total_steps
        return bool(every) and self.step % every == 0 and not last

    # -- validation --------------------------------------------------------------------

    async def validate(self) -> dict[str, float]:
        """mean@k of the reward on the validation rows with the current weights."""
        sampling = SamplingParams(
            max_tokens=self.cfg.rollout.max_response_length,
            temperature=self.cfg.trainer.val_temperature,
            top_p=1.0,
        )
        requests = make_requests(self.val_rows, self.cfg.trainer.val_n, sampling)
        episodes = [e async for e in self.manager.stream_requests(requests)]
        _, metrics = await score_episodes(
            episodes, _rows_by_group(requests), self.rewards, self.tokenizer
        )
        return {f"val/{k.removeprefix('reward/')}": v for k, v in metrics.items()}

    async def _maybe_validate(self, force: bool = False) -> None:
        every = self.cfg.trainer.val_every
        if not self.val_rows or not every or (not force and self.step % every):
            return
        self.tracker.log(self.step, await self.validate())

    # -- checkpoints and samples -------------------------------------------------------

    def save_checkpoint(self) -> Path:
        """The actor (model, optimizer, scheduler, RNG) with step, version, data position
        and the in-reward KL controller's state; the critic's the same way under
        ``critic/``."""
        path = self.run_dir / "checkpoints" / f"step_{self.step}"
        extra = {"step": self.step, "version": self.version, **self._data_state()}
        if self.kl_controller is not None:
            extra["kl_controller"] = self.kl_controller.state_dict()
        # Recorded before the checkpoint exists: a driver killed once it is written but
        # before a line after it would leave a checkpoint the audit never heard of, and
        # the run resumed from it could not be replayed. Nothing runs in between (the
        # save blocks the loop), so the pending rows are the checkpoint's.
        self.audit.checkpoint(self.step, self._pending_rows())
        if self.critic is not None:  # first: the actor's trainer state marks it complete
            self.critic.save_checkpoint(str(path / CRITIC_DIR), extra={"step": self.step})
        self.actor.save_checkpoint(str(path), extra=extra)
        self.audit.saved(self.step)
        logger.info("saved checkpoint %s", path)
        return path

    def _pending_rows(self) -> list[int]:
        """Rows handed out and not done, which a resumed run hands out again (none: a
        synchronous step trains every row it hands out)."""
        return []

    def _resume(self, checkpoint: Path) -> None:
        extra = self.actor.load_checkpoint(str(checkpoint))
        self.step, self.version = extra["step"], extra["version"]
        self._load_data_state(extra)
        if self.kl_controller is not None:
            self.kl_controller.load_state_dict(extra.get("kl_controller", {}))
        if self.critic is not None:
            self._resume_critic(checkpoint / CRITIC_DIR)
        logger.info("resumed from %s at step %d", checkpoint, self.step)

    def _resume_critic(self, path: Path) -> None:
        if (path / TRAINER_STATE_FILE).is_file():
            self.critic.load_checkpoint(str(path))
            return
        logger.warning(
            "%s holds no critic (its run trained without one): the critic starts from its "
            "initial weights with a fresh optimizer",
            path.parent,
        )

    def _data_state(self) -> dict[str, Any]:
        """The data position saved with a checkpoint."""
        return {"loader": self.loader.state_dict() if self.loader is not None else None}

    def _load_data_state(self, extra: dict[str, Any]) -> None:
        if self.loader is None:
            return
        if extra.get("loader") is not None:
            self.loader.load_state_dict(extra["loader"])
        elif extra.get("row_feed") is not None:  # an asynchronous run's checkpoint
            feed = extra["row_feed"]
            if feed["pending"]:
                raise ValueError(
                    f"this run's checkpoint (step {extra['step']}) was written by the "
                    f"asynchronous trainer with {len(feed['pending'])} rows started and "
                    "not trained yet, which the synchronous trainer cannot hand out "
                    "again: continue the run without --sync"
                )
            self.loader.load_state_dict(feed["loader"])  # rows_drawn: the feed's next

    def _save_samples(self, samples: list[Sample]) -> None:
        count = self.cfg.trainer.samples_to_save
        if count:
            write_samples(
                self.run_dir / "samples" / f"step_{self.step + 1}.txt",
                samples[:count],
                self.tokenizer,
            )


def _rows_by_group(requests: list[EpisodeRequest]) -> dict[str, dict[str, Any]]:
    return {r.group_id: r.row for r in requests}


def _rows_of(episodes: Iterable[EpisodeResult]) -> set[int]:
    """The dataset rows of ``episodes`` (gateway sessions have none)."""
    return {e.row_index for e in episodes if e.row_index >= 0}
