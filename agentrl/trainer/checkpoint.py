"""Checkpoints of a sharded model and the gathering of its full weights.

A checkpoint directory holds:

- ``model_optim/``: model and optimizer state, written shard by shard by every rank
  (``torch.distributed.checkpoint``; it reloads on a different world size);
- ``trainer_state.pt`` (rank 0): scheduler state, step, and the caller's opaque
  ``extra`` dict (the trainer keeps the dataloader position there);
- ``rng_rank{r}.pt``: each rank's Python, NumPy and torch RNG states.

The trainer writes the actor's checkpoint there and, in a run with a critic, the
critic's the same way in ``critic/`` (``CRITIC_DIR``) first.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.optim.lr_scheduler import LRScheduler

logger = logging.getLogger(__name__)

MODEL_OPTIM_DIR = "model_optim"
TRAINER_STATE_FILE = "trainer_state.pt"
CRITIC_DIR = "critic"


def save_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    step: int,
    extra: dict[str, Any] | None = None,
) -> None:
    """Write a checkpoint of this rank's shards to ``path`` (call on every rank)."""
    root = Path(path)
    rank = dist.get_rank()
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=root / MODEL_OPTIM_DIR)
    torch.save(_rng_state(), root / f"rng_rank{rank}.pt")
    if rank == 0:
        state = {"scheduler": scheduler.state_dict(), "step": step, "extra": extra or {}}
        torch.save(state, root / TRAINER_STATE_FILE)
    dist.barrier()
    logger.info("rank %d saved checkpoint at step %d to %s", rank, step, root)


def load_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
) -> tuple[int, dict[str, Any]]:
    """Restore a checkpoint written by :func:`save_checkpoint`; returns ``(step, extra)``."""
    root = Path(path)
    if not (root / TRAINER_STATE_FILE).is_file():
        raise FileNotFoundError(f"{root} is not a checkpoint: it has no {TRAINER_STATE_FILE}")
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=root / MODEL_OPTIM_DIR)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    trainer_state = torch.load(root / TRAINER_STATE_FILE, weights_only=False)
    scheduler.load_state_dict(trainer_state["scheduler"])
    rng_file = root / f"rng_rank{dist.get_rank()}.pt"
    if rng_file.is_file():
        _set_rng_state(torch.load(rng_file, weights_only=False))
    else:
        logger.warning("%s missing (different world size?): RNG state not restored", rng_file)
    return int(trainer_state["step"]), dict(trainer_state["extra"])


def full_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The unsharded state dict on rank 0's CPU (empty on other ranks); collective."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def _rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
