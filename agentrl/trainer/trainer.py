"""``Trainer``: the fit loop on Ray (single controller, FSDP2 workers).

Each step tells the same story, synchronous or not:

    batch → reward → old log-probs → reference → advantages → update → push weights

Where the batch comes from is the only difference: ``SyncBatches`` generates it when the
step asks, ``AsyncBatches`` (``AsyncTrainer``) takes it from a queue that generation
fills ahead of training. What the run starts and stops is ``RunProcesses``
(``processes.py``); where its rows and episodes went, and its data position, is
``RunLedger`` (``ledger.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import contextmanager
from pathlib import Path

import yaml
from transformers import AutoTokenizer

from agentrl.algos import DynamicSampler, DynamicSamplingError, KLController
from agentrl.config import AgentRLConfig, resolve_user_config
from agentrl.core.types import INITIAL_WEIGHT_VERSION, SamplingParams
from agentrl.data.dataset import build_dataset
from agentrl.data.loader import RowLoader
from agentrl.preflight import check_algorithm, check_inputs
from agentrl.rollout.episode import make_requests
from agentrl.trainer.batch import Sample, build_batch
from agentrl.trainer.batches import BatchSource, StepBatch, SyncBatches
from agentrl.trainer.checkpoint import CRITIC_DIR, TRAINER_STATE_FILE
from agentrl.trainer.dispatch import Batch
from agentrl.trainer.ledger import RunLedger
from agentrl.trainer.losses import make_actor_loss, make_critic_loss
from agentrl.trainer.processes import RunProcesses
from agentrl.trainer.resume import CONFIG_FILE, check_resume
from agentrl.trainer.samples import write_samples
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
    """Trains ``trainer.total_steps`` steps: ``setup``, then ``fit``, then ``shutdown``."""

    def __init__(self, cfg: AgentRLConfig) -> None:
        self.cfg = cfg
        self.run_dir = Path(cfg.trainer.run_dir)
        self.step = 0
        self.version = INITIAL_WEIGHT_VERSION
        self._catch_up_pushes: dict[int, int] = {}  # version -> pushes to lagging replicas
        # Set by setup().
        self.processes = RunProcesses(cfg)
        self.ledger = RunLedger(self.run_dir, None)
        self.kl_controller: KLController | None = None

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
        self.ledger = RunLedger(self.run_dir, self._row_loader())
        kl = cfg.algorithm.kl
        self.kl_controller = kl.make_controller() if kl.use_kl_in_reward else None
        self.loss_fn = make_actor_loss(cfg.algorithm)
        self.critic_loss_fn = make_critic_loss(cfg.algorithm)
        self.processes = RunProcesses.start(cfg, self.run_dir)
        try:
            if checkpoint is not None:
                self._resume(checkpoint)
            self.ledger.open(self.step if checkpoint is not None else None)
            self.batches = self.make_batch_source()
        except BaseException:
            self._stop(log_failures_as="stopping after a failed setup: %r")
            raise

    def make_batch_source(self) -> BatchSource:
        """Where this trainer's batches come from: generated by each step."""
        return SyncBatches(
            self.cfg, self.processes.manager, self.ledger, self.keep_replicas_current
        )

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
        failures = self._stop(log_failures_as="stopping: %r", first_raised=True)
        if failures:
            raise failures[0]

    def _stop(self, log_failures_as: str, first_raised: bool = False) -> list[Exception]:
        """Close the ledger and stop the processes; logs the failed stops (all but the
        first when it is to be raised) and returns them."""
        failures: list[Exception] = []
        try:
            self.ledger.close()
        except Exception as failure:  # the processes must still stop
            failures.append(failure)
        failures += self.processes.stop()
        for failure in failures[1 if first_raised else 0 :]:
            logger.error(log_failures_as, failure)
        return failures

    # -- the loop ----------------------------------------------------------------------

    async def fit(self) -> list[dict[str, float]]:
        """Train ``trainer.total_steps`` steps and save a checkpoint; returns each step's
        logged metrics. The rollout client's data path (the mismatch probe's generate
        calls) routes on this event loop until the steps end."""
        async with self.processes.client:
            history = await self.train_steps()
        if not self._checkpoint_due():  # else the loop stopped early, just after one
            self.save_checkpoint()
        return history

    async def train_steps(self) -> list[dict[str, float]]:
        """The fit loop: take a batch, train on it, push the weights; until the last
        step, or until the batch source has no more batches."""
        history = []
        await self.serve_restored_weights()
        await self.batches.start(self.version)
        try:
            await self._maybe_validate(force=True)
            total = self.cfg.trainer.total_steps
            while self.step < total:
                metrics: dict[str, float] = {}
                with timer(metrics, "step"):
                    with timer(metrics, "wait_for_batch"):
                        batch = await self.batches.next_batch(
                            self.step + 1, last=self.step + 1 >= total
                        )
                    if batch is None:
                        break
                    metrics |= batch.metrics
                    metrics |= await self.train_on(batch, metrics)
                    self.ledger.settle(batch.group_ids, batch.dropped_group_ids)
                    metrics |= await self.batches.step_done(self.version)
                history.append(await self._finish_step(metrics))
        finally:
            await self.batches.close()
        return history

    async def train_on(self, batch: StepBatch, metrics: dict[str, float]) -> dict[str, float]:
        """Reward → batch → log-probs → advantages → update → push weights."""
        episodes = sorted(batch.episodes, key=lambda e: (e.row_index, e.sample_index))
        self.ledger.accept(episodes)
        metrics["trainer/episodes"] = float(len(episodes))
        with timer(metrics, "reward"):
            samples, reward_metrics = await score_episodes(
                episodes, batch.rows_by_group, self.processes.rewards, self.tokenizer
            )
        metrics |= reward_metrics
        if self.cfg.algorithm.dynamic_sampling.enable:
            samples = await self.informative(samples, metrics, batch)
        if len(samples) < self.cfg.workers.actor.world_size:
            logger.warning(
                "step %d: only %d usable samples, skipping update", self.step, len(samples)
            )
            return metrics
        self._save_samples(samples)
        tensors, group_ids = build_batch(samples, self.tokenizer.pad_token_id)
        metrics |= staleness_metrics(tensors, self.version)
        with timer(metrics, "old_log_prob"):
            metrics |= await self._behaviour_log_probs(tensors)
        processes = self.processes
        if processes.ref is not None:
            with timer(metrics, "ref"):
                tensors["ref_log_probs"] = (
                    await asyncio.to_thread(processes.ref.compute_log_prob, tensors)
                )["log_probs"]
        if processes.critic is not None:
            with timer(metrics, "values"):
                tensors["values"] = (
                    await asyncio.to_thread(processes.critic.compute_values, tensors)
                )["values"]
        metrics |= add_advantages(
            tensors,
            group_ids,
            self.cfg.algorithm,
            self.cfg.rollout.max_response_length,
            self.kl_controller,
        )
        with timer(metrics, "train"):
            if processes.critic is not None:
                metrics |= await asyncio.to_thread(
                    processes.critic.update_critic, tensors, self.critic_loss_fn
                )
            metrics |= await asyncio.to_thread(
                processes.actor.update_actor,
                tensors,
                self.loss_fn,
                with_entropy=True,
                entropy_grad=self.cfg.algorithm.kl.entropy_coeff > 0,
            )
        self.ledger.trained(
            self.step + 1, {s.row_index for s in samples}, (s.episode_id for s in samples)
        )
        with timer(metrics, "weight_sync"):
            metrics |= await self.push_weights()
        if self._probe_due():
            with timer(metrics, "mismatch_probe"):
                metrics |= await self.probe_mismatch(samples)
        return metrics

    async def informative(
        self, samples: list[Sample], metrics: dict[str, float], batch: StepBatch
    ) -> list[Sample]:
        """DAPO dynamic sampling: keep groups whose scores differ. A source that
        regenerates gives the step more groups (added to ``batch``) until
        ``train_batch_size`` groups are kept or ``max_num_gen_batches`` is reached; then
        the step goes on with the groups kept so far, with a warning."""
        regenerates = self.batches.regenerates
        sampler: DynamicSampler[list[Sample]] = DynamicSampler(
            num_groups=self.cfg.data.train_batch_size,
            max_num_gen_batches=(
                self.cfg.algorithm.dynamic_sampling.max_num_gen_batches if regenerates else 0
            ),
        )
        try:
            sample_groups(sampler, samples)
            while not sampler.is_full and (more := await self.batches.more()) is not None:
                batch.extend(more)
                scored, _ = await score_episodes(
                    more.episodes, more.rows_by_group, self.processes.rewards, self.tokenizer
                )
                sample_groups(sampler, scored)
        except DynamicSamplingError as error:
            logger.warning("step %d: %s", self.step + 1, error)
        return sampled(sampler, metrics)

    async def serve_restored_weights(self) -> None:
        """After a resume the servers still hold the initial weights: push the restored
        ones, labelled with the restored version, before anything is generated."""
        if self.version != INITIAL_WEIGHT_VERSION:
            await self.processes.sync.push_from(self.processes.actor, self.version)
            logger.info("pushed the restored weights (version %d) to the servers", self.version)

    async def keep_replicas_current(self) -> None:
        """Push the current weights again when a replica serves an older version: Serve
        restarts a replica that died with the initial weights (version 0), and everything
        it samples would be stale. Call only between steps (the actor holds
        ``self.version``)."""
        if self.version == INITIAL_WEIGHT_VERSION:
            return
        try:
            stats = await asyncio.wait_for(
                self.processes.client.control.stats(), _REPLICA_STATS_TIMEOUT_S
            )
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
        await self.processes.sync.push_from(self.processes.actor, self.version)

    async def push_weights(self) -> dict[str, float]:
        """Send the actor's weights to every rollout replica as the next version."""
        self.version += 1
        timings = await self.processes.sync.push_from(self.processes.actor, self.version)
        return timings.metrics()

    async def _behaviour_log_probs(self, batch: Batch) -> dict[str, float]:
        if self.cfg.trainer.old_log_probs == "rollout":
            batch["old_log_probs"] = batch["rollout_log_probs"].clone()
            return {}
        out = await asyncio.to_thread(self.processes.actor.compute_log_prob, batch)
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
        rows = max(self.cfg.trainer.mismatch_probe_rows, self.processes.actor.world_size)
        prompts = probe_prompts(samples, rows)
        sampling = self.processes.manager.default_sampling()
        answers = await asyncio.gather(
            *(self.processes.client.data.generate(None, prompt, sampling) for prompt in prompts),
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
        if probe is None or probe["input_ids"].shape[0] < self.processes.actor.world_size:
            logger.warning("step %d: no mismatch probe (too few answers)", self.step + 1)
            return {}
        out = await asyncio.to_thread(self.processes.actor.compute_log_prob, probe)
        return mismatch_metrics(probe, out["log_probs"])

    async def _finish_step(self, metrics: dict[str, float]) -> dict[str, float]:
        self.step += 1
        metrics["trainer/version"] = float(self.version)
        await self._maybe_validate()
        # The line before the checkpoint: a driver killed between the two then trains and
        # logs this step again on resume (the later line wins), instead of resuming past
        # a step that metrics.jsonl never recorded.
        logged = self.processes.tracker.log(self.step, metrics)
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
        episodes = [e async for e in self.processes.manager.stream_requests(requests)]
        _, metrics = await score_episodes(
            episodes, {r.group_id: r.row for r in requests}, self.processes.rewards, self.tokenizer
        )
        return {f"val/{k.removeprefix('reward/')}": v for k, v in metrics.items()}

    async def _maybe_validate(self, force: bool = False) -> None:
        every = self.cfg.trainer.val_every
        if not self.val_rows or not every or (not force and self.step % every):
            return
        self.processes.tracker.log(self.step, await self.validate())

    # -- checkpoints and samples -------------------------------------------------------

    def save_checkpoint(self) -> Path:
        """The actor (model, optimizer, scheduler, RNG) with step, version, data position
        and the in-reward KL controller's state; the critic's the same way under
        ``critic/``."""
        path = self.run_dir / "checkpoints" / f"step_{self.step}"
        extra = {"step": self.step, "version": self.version, **self.ledger.state_dict()}
        if self.kl_controller is not None:
            extra["kl_controller"] = self.kl_controller.state_dict()
        # Nothing runs between this and the save (it blocks the loop), so the pending
        # rows recorded are the checkpoint's.
        self.ledger.checkpoint(self.step)
        actor, critic = self.processes.actor, self.processes.critic
        if critic is not None:  # first: the actor's trainer state marks it complete
            critic.save_checkpoint(str(path / CRITIC_DIR), extra={"step": self.step})
        actor.save_checkpoint(str(path), extra=extra)
        self.ledger.saved(self.step)
        logger.info("saved checkpoint %s", path)
        return path

    def _resume(self, checkpoint: Path) -> None:
        extra = self.processes.actor.load_checkpoint(str(checkpoint))
        self.step, self.version = extra["step"], extra["version"]
        self.ledger.load_state_dict(extra)
        if self.kl_controller is not None:
            self.kl_controller.load_state_dict(extra.get("kl_controller", {}))
        if self.processes.critic is not None:
            self._resume_critic(checkpoint / CRITIC_DIR)
        logger.info("resumed from %s at step %d", checkpoint, self.step)

    def _resume_critic(self, path: Path) -> None:
        if (path / TRAINER_STATE_FILE).is_file():
            self.processes.critic.load_checkpoint(str(path))
            return
        logger.warning(
            "%s holds no critic (its run trained without one): the critic starts from its "
            "initial weights with a fresh optimizer",
            path.parent,
        )

    def _save_samples(self, samples: list[Sample]) -> None:
        count = self.cfg.trainer.samples_to_save
        if count:
            write_samples(
                self.run_dir / "samples" / f"step_{self.step + 1}.txt",
                samples[:count],
                self.tokenizer,
            )
