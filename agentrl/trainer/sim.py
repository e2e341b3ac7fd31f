"""The simulated trainer (``workers.backend=sim``): role groups without a model.

``SimActorGroup``, ``SimReferenceGroup`` and ``SimCriticGroup`` stand where
``ActorGroup``, ``ReferenceGroup`` and ``CriticGroup`` (``group.py``) do, in the driver's
process: each call sleeps the GPU time :class:`TrainerTimeModel` gives for the batch's
tokens (times the time scale) and returns what the trainer reads next. Log-probs are the
rollout's own, values are zero, and the weights are one tag tensor, so the real parts
around them run unchanged: the queue, staleness control, advantages, the weight push and
its versions, checkpoints and resume. Nothing here asks Ray for a GPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from agentrl.config import AgentRLConfig
from agentrl.trainer.checkpoint import TRAINER_STATE_FILE
from agentrl.trainer.config import ActorConfig, CriticConfig
from agentrl.trainer.dispatch import Batch
from agentrl.trainer.sim_model import TrainerTimeModel

logger = logging.getLogger(__name__)

SIM_ENGINES = ("sim", "null")
"""The engines a simulated trainer can push to: they take a tag tensor as weights."""

WEIGHT_TAG = "sim.weight_version"
"""Name of the one tensor a simulated weight push carries (the engines read the version)."""


class SimClock:
    """Sleeps modeled seconds (times ``time_scale``) and adds them up, per role."""

    def __init__(self, model: TrainerTimeModel, time_scale: float) -> None:
        self.model = model
        self.time_scale = time_scale
        self.busy_s: dict[str, float] = {}

    def spend(self, role: str, modeled_s: float) -> float:
        """Sleep ``modeled_s`` modeled seconds in this thread; returns them."""
        time.sleep(modeled_s * self.time_scale)
        self.busy_s[role] = self.busy_s.get(role, 0.0) + modeled_s
        return modeled_s


def sequence_lengths(batch: Batch) -> list[int]:
    """Tokens of every row (prompt and response), from the attention mask."""
    return batch["attention_mask"].sum(dim=-1).tolist()


class _SimGroup:
    """What every simulated role has: a world size, a clock and a tiny checkpoint."""

    role = "ref"

    def __init__(self, clock: SimClock, world_size: int) -> None:
        self.clock = clock
        self.world_size = world_size
        self.updates = 0

    def save_checkpoint(self, path: str, extra: dict[str, Any] | None = None) -> None:
        """Write ``trainer_state.pt`` with the update count and ``extra`` (no weights)."""
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        state = {"step": self.updates, "extra": extra or {}, "sim_busy_s": self.clock.busy_s}
        torch.save(state, root / TRAINER_STATE_FILE)

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Restore what ``save_checkpoint`` wrote; returns its ``extra``."""
        file = Path(path) / TRAINER_STATE_FILE
        if not file.is_file():
            raise FileNotFoundError(f"{path} is not a checkpoint: it has no {TRAINER_STATE_FILE}")
        state = torch.load(file, weights_only=False)
        self.updates = int(state["step"])
        return dict(state["extra"])

    def shutdown(self) -> None:
        """Nothing runs outside the driver."""

    def _forward(self, batch: Batch) -> None:
        self.clock.spend(self.role, self.clock.model.pass_s(sequence_lengths(batch)))


class SimReferenceGroup(_SimGroup):
    """The frozen reference: one modeled forward; its log-probs are the rollout's."""

    def compute_log_prob(
        self, batch: Batch, *, temperature: float = 1.0, with_entropy: bool = False
    ) -> dict[str, Tensor]:
        """``{"log_probs"}`` (+ zero ``"entropy"``) after a modeled forward pass."""
        self._forward(batch)
        out = {"log_probs": batch["rollout_log_probs"].clone()}
        if with_entropy:
            out["entropy"] = torch.zeros_like(out["log_probs"])
        return out


class SimActorGroup(SimReferenceGroup):
    """The policy: modeled updates, and weights that are one version tag."""

    role = "actor"

    def __init__(self, clock: SimClock, config: ActorConfig) -> None:
        super().__init__(clock, config.world_size)
        self.config = config

    def update_actor(
        self,
        batch: Batch,
        loss_fn: Any,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
        entropy_grad: bool = True,
    ) -> dict[str, float]:
        """A modeled update (forward + backward per epoch); ``actor/sim_update_s``."""
        model = self.clock.model
        passes = model.update_passes(self.config.epochs, self.config.fsdp.gradient_checkpointing)
        seconds = self.clock.spend("actor", model.pass_s(sequence_lengths(batch), passes))
        self.updates += 1
        return {"actor/sim_update_s": seconds}

    def named_weights(self, bucket_bytes: int = 0) -> Iterator[tuple[str, Tensor]]:
        """After the modeled push time, the weights: one tag tensor, which the simulated
        and null engines take as a new version."""
        self.clock.spend("push", self.clock.model.push_s())
        yield WEIGHT_TAG, torch.zeros(1)


class SimCriticGroup(_SimGroup):
    """The value model: zero values after a modeled forward, modeled updates."""

    role = "critic"

    def __init__(self, clock: SimClock, config: CriticConfig) -> None:
        super().__init__(clock, config.world_size)
        self.config = config

    def compute_values(self, batch: Batch) -> dict[str, Tensor]:
        """``{"values"}``: zeros, after a modeled forward pass."""
        self._forward(batch)
        return {"values": torch.zeros_like(batch["response_mask"])}

    def update_critic(self, batch: Batch, loss_fn: Any) -> dict[str, float]:
        """A modeled update of the critic; ``critic/sim_update_s``."""
        model = self.clock.model
        passes = model.update_passes(self.config.epochs, self.config.fsdp.gradient_checkpointing)
        seconds = self.clock.spend("critic", model.pass_s(sequence_lengths(batch), passes))
        self.updates += 1
        return {"critic/sim_update_s": seconds}


def sim_groups(
    cfg: AgentRLConfig, *, with_ref: bool, with_critic: bool
) -> tuple[SimActorGroup, SimReferenceGroup | None, SimCriticGroup | None]:
    """The simulated actor, and the reference and critic when the algorithm needs them,
    sharing one clock (they share the modeled GPUs).

    Raises ValueError for a setup the simulation cannot run: a real engine (it would be
    sent a tag for weights), a weight transport other than ``object_store``, or model
    states that do not fit the modeled GPUs.
    """
    engine = cfg.server.engine
    if engine.backend not in SIM_ENGINES:
        raise ValueError(
            f"workers.backend=sim needs server.engine.backend in {SIM_ENGINES}, got "
            f"{engine.backend!r}: a simulated trainer has no weights to push to a real engine"
        )
    if cfg.weight_sync.kind != "object_store":
        raise ValueError(
            f"workers.backend=sim pushes through weight_sync.kind=object_store, got "
            f"{cfg.weight_sync.kind!r}"
        )
    sim = cfg.workers.sim
    scale = sim.time_scale or (engine.sim.time_scale if engine.backend == "sim" else 1.0)
    model = sim.time_model(with_ref=with_ref, with_critic=with_critic)
    clock = SimClock(model, scale)
    logger.info(
        "simulated trainer: %s on %d GPUs, MFU %.2f, push %.2f s, time scale %g",
        model.profile.name,
        model.num_gpus,
        model.mfu,
        model.push_s(),
        scale,
    )
    workers = cfg.workers
    return (
        SimActorGroup(clock, workers.actor),
        SimReferenceGroup(clock, workers.ref.world_size) if with_ref else None,
        SimCriticGroup(clock, workers.critic) if with_critic else None,
    )
