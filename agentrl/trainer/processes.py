"""``RunProcesses``: what a training run starts on Ray, and stops again.

The rollout replicas (and the gateway in front of them when enabled), the FSDP ranks —
actor, reference when a KL term needs it, critic for GAE — or their simulated stand-ins
(``workers.backend: sim``), the agent-loop workers, the reward manager (with its judge
application), the weight sync and the metrics logger.

``RunProcesses.start`` starts them in order; when one fails it stops what had started
before it re-raises, so a failed start leaves no Serve application holding its devices.
``stop`` tries every stop even when one before it failed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from agentrl.config import AgentRLConfig
from agentrl.placement import rollout_actor_resources
from agentrl.reward.manager import RewardManager
from agentrl.rollout.manager import AgentLoopManager
from agentrl.server.client import ServerClient
from agentrl.server.gateway.deployment import start_gateway, stop_gateway
from agentrl.server.launch import init_ray, start_rollout_servers, stop_rollout_servers
from agentrl.server.weight_transport import make_weight_sync
from agentrl.server.weight_transport.base import WeightSync
from agentrl.tracking import MetricsLogger
from agentrl.trainer.group import ActorGroup, CriticGroup, ReferenceGroup
from agentrl.trainer.sim import sim_groups

logger = logging.getLogger(__name__)


@dataclass
class RunProcesses:
    """Handles to everything a run started; None for what it did not start (yet)."""

    cfg: AgentRLConfig
    client: ServerClient | None = None
    manager: AgentLoopManager | None = None
    rewards: RewardManager | None = None
    actor: ActorGroup | None = None
    ref: ReferenceGroup | None = None
    critic: CriticGroup | None = None
    sync: WeightSync | None = None
    tracker: MetricsLogger | None = None
    servers_started: bool = False
    gateway_started: bool = False

    @classmethod
    def start(cls, cfg: AgentRLConfig, run_dir: Path) -> RunProcesses:
        """Start Ray and everything the run needs; metrics go to ``run_dir``."""
        init_ray(cfg.ray)
        processes = cls(cfg)
        try:
            processes._start(run_dir)
        except BaseException:
            for failure in processes.stop():
                logger.error("stopping after a failed start: %r", failure)
            raise
        return processes

    def _start(self, run_dir: Path) -> None:
        cfg = self.cfg
        # The replicas and the training ranks start at once: a vLLM replica imports vLLM
        # in three processes one after the other, which alone leaves a core idle.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-start") as pool:
            rollout_start = pool.submit(self._start_rollout_servers)
            self._start_training_workers()  # on failure, raises once the servers are up
        self.client = rollout_start.result()
        self.manager = AgentLoopManager(cfg)
        self.rewards = RewardManager.from_config(cfg.reward, cfg.model, cfg.server)
        self.sync = make_weight_sync(cfg.weight_sync, self.client.control)
        self.tracker = MetricsLogger.from_config(
            run_dir, cfg.logging, total_steps=cfg.trainer.total_steps
        )

    def _start_rollout_servers(self) -> ServerClient:
        """The rollout replicas, and the gateway in front of them when enabled."""
        cfg = self.cfg
        self.servers_started = True  # a deployment that fails half-way is deleted too
        client = start_rollout_servers(
            cfg.model, cfg.server, rollout_actor_resources(cfg.placement.rollout)
        )
        if cfg.gateway.enabled:  # external agents (agent_name: external) call it
            self.gateway_started = True
            start_gateway(cfg.gateway, cfg.model, cfg.server)
        return client

    def _start_training_workers(self) -> None:
        """The FSDP ranks: actor, reference (when a KL term needs it), critic (GAE)."""
        cfg = self.cfg
        kl = cfg.algorithm.kl
        with_ref = kl.use_kl_loss or kl.use_kl_in_reward
        with_critic = cfg.algorithm.adv_estimator == "gae"
        if cfg.workers.backend == "sim":  # modeled GPU time, no ranks (agentrl.trainer.sim)
            self.actor, self.ref, self.critic = sim_groups(
                cfg, with_ref=with_ref, with_critic=with_critic
            )
            return
        total = cfg.trainer.total_steps
        placement = cfg.placement.trainer
        self.actor = ActorGroup(
            cfg.workers.actor, cfg.model.path, total_training_steps=total, placement=placement
        )
        if with_ref:
            self.ref = ReferenceGroup(cfg.workers.ref, cfg.model.path, placement=placement)
        if with_critic:
            critic_cfg = cfg.workers.critic
            self.critic = CriticGroup(
                critic_cfg, critic_cfg.model_path or cfg.model.path, total_training_steps=total
            )

    def stop(self) -> list[Exception]:
        """Stop, in order, what has started; returns the stops that failed."""
        cfg = self.cfg
        stops: list[Callable[[], object]] = [
            part.close for part in (self.tracker, self.rewards) if part is not None
        ]
        if self.manager is not None:
            stops.append(self.manager.shutdown)
        stops += [g.shutdown for g in (self.actor, self.ref, self.critic) if g is not None]
        if self.gateway_started:
            stops.append(lambda: stop_gateway(cfg.gateway))
        if self.servers_started:
            stops.append(lambda: stop_rollout_servers(cfg.server))
        failures = []
        for stop in stops:
            try:
                stop()
            except Exception as failure:  # the next stop must still run
                failures.append(failure)
        self.tracker = self.rewards = self.manager = None
        self.actor = self.ref = self.critic = None
        self.gateway_started = self.servers_started = False
        return failures
