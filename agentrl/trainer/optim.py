"""AdamW and the learning-rate schedule (linear warmup, then constant or cosine)."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from agentrl.trainer.config import OptimConfig


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters of ``model``."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{type(model).__name__} has no trainable parameters")
    return torch.optim.AdamW(
        params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay
    )


def lr_factor(step: int, cfg: OptimConfig, total_steps: int | None) -> float:
    """Multiplier of ``cfg.lr`` at training step ``step`` (0-based).

    Warmup: ``(step + 1) / warmup_steps`` for the first ``warmup_steps`` steps. Then 1
    (constant), or cosine from 1 to ``min_lr_ratio`` at ``total_steps``.
    """
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    if total_steps is None:
        raise ValueError("optim.schedule=cosine needs the total number of training steps")
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int | None
) -> LambdaLR:
    """The LR schedule of ``cfg``, stepped once per training step."""
    if cfg.schedule == "cosine" and total_steps is None:
        raise ValueError(
            "optim.schedule=cosine needs total_training_steps (pass it to the worker group)"
        )
    return LambdaLR(optimizer, lambda step: lr_factor(step, cfg, total_steps))
