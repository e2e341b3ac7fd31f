"""``agentrl eval CONFIG --checkpoint PATH``: the validation metrics of a saved checkpoint.

    result = evaluate(cfg, "runs/retool-cpu/checkpoints/step_40")
    result["metrics"]["val/acc/mean"]

Starts what training starts (``Trainer.setup``: Ray, rollout servers, agent-loop and
FSDP workers), loads the checkpoint into the actor, pushes its weights to the rollout
servers and runs ``Trainer.validate``: mean@k of the reward over ``data.val_files`` with
``trainer.val_n`` samples per prompt at ``trainer.val_temperature``.

The trainer works in ``<run_dir>/eval/<checkpoint name>/`` (the resolved config and a
``metrics.jsonl`` of the evaluation), so the training run's own config and metrics are
never touched; it does not resume and starts no reference or critic model. The result
is printed and written to ``<run_dir>/eval.json`` (or ``out``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

from agentrl.config import AgentRLConfig, ConfigError

logger = logging.getLogger(__name__)

CHECKPOINT_MARKERS = ("trainer_state.pt", "model_optim")
"""Entries a checkpoint directory written by ``Trainer.save_checkpoint`` holds."""


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a checkpoint directory."""
    return path.is_dir() and any((path / marker).exists() for marker in CHECKPOINT_MARKERS)


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory, or the latest ``checkpoints/step_N`` of a run directory.

    Raises:
        ConfigError: nothing at ``path`` is a checkpoint; the message lists what is.
    """
    path = Path(path)
    if is_checkpoint(path):
        return path
    for root in (path / "checkpoints", path):
        found = sorted(
            (p for p in root.glob("step_*") if is_checkpoint(p)),
            key=lambda p: int(re.sub(r"\D", "", p.name) or 0),
        )
        if found:
            return found[-1]
    if not path.exists():
        raise ConfigError(f"--checkpoint {path}: no such file or directory")
    raise ConfigError(
        f"--checkpoint {path} is not a checkpoint (a directory holding "
        f"{' or '.join(CHECKPOINT_MARKERS)}, e.g. RUN_DIR/checkpoints/step_N) nor a run "
        "directory with checkpoints"
    )


def eval_config(cfg: AgentRLConfig, checkpoint: Path) -> AgentRLConfig:
    """``cfg`` for an evaluation of ``checkpoint``: own work dir, no resume, and no
    reference or critic model (validation uses neither), whatever the estimator."""
    if not cfg.data.val_files:
        raise ConfigError(
            "eval needs validation data: set data.val_files (e.g. data.val_files=[val.jsonl])"
        )
    cfg = cfg.model_copy(deep=True)
    cfg.trainer.run_dir = str(Path(cfg.trainer.run_dir) / "eval" / checkpoint.name)
    cfg.trainer.resume = False
    cfg.algorithm.kl.use_kl_loss = False
    cfg.algorithm.kl.use_kl_in_reward = False
    # Validation computes no advantages: no critic to start (GAE), no inputs the trainer
    # lacks (ReMax's greedy baselines) to refuse a checkpoint over.
    cfg.algorithm.adv_estimator = "grpo"
    return cfg


async def _validate_checkpoint(trainer: Any, checkpoint: Path) -> dict[str, float]:
    trainer.processes.tracker.stop_progress()  # no training steps to show
    extra = trainer.processes.actor.load_checkpoint(str(checkpoint)) or {}
    trainer.step = int(extra.get("step", 0))
    # push_weights() sends the next version: the servers then hold the checkpoint's.
    trainer.version = max(int(extra.get("version", 1)), 1) - 1
    await trainer.push_weights()
    metrics = await trainer.validate()
    trainer.processes.tracker.log(trainer.step, metrics)
    return metrics


def evaluate(
    cfg: AgentRLConfig,
    checkpoint: str | Path,
    out: str | Path | None = None,
    trainer_cls: type | None = None,
) -> dict[str, Any]:
    """Validate ``checkpoint`` (a checkpoint or run directory); write and return the result.

    The result holds ``checkpoint``, ``step``, ``version``, the validation settings,
    ``metrics`` (``val/score/mean``, ``val/acc/mean``, ``val/…``) and ``seconds``.
    """
    path = resolve_checkpoint(checkpoint)
    eval_cfg = eval_config(cfg, path)
    if trainer_cls is None:
        from agentrl.trainer.trainer import Trainer

        trainer_cls = Trainer
    out_path = Path(out) if out is not None else Path(cfg.trainer.run_dir) / "eval.json"
    start = time.perf_counter()
    trainer = trainer_cls(eval_cfg)
    logger.info("evaluating %s (work dir %s)", path, eval_cfg.trainer.run_dir)
    trainer.setup()
    try:
        metrics = asyncio.run(_validate_checkpoint(trainer, path))
    finally:
        trainer.shutdown()
    result = {
        "checkpoint": str(path),
        "step": trainer.step,
        "version": trainer.version,
        "val_files": list(cfg.data.val_files),
        "val_n": cfg.trainer.val_n,
        "val_temperature": cfg.trainer.val_temperature,
        "metrics": metrics,
        "seconds": round(time.perf_counter() - start, 3),
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    return result


def format_result(result: dict[str, Any], out: Path | None = None) -> str:
    """A few lines for the console: where from, and every metric."""
    lines = [f"checkpoint {result['checkpoint']} (step {result['step']})"]
    width = max((len(k) for k in result["metrics"]), default=0)
    lines += [f"  {k:<{width}}  {v:.4g}" for k, v in sorted(result["metrics"].items())]
    if out is not None:
        lines.append(f"written to {out}")
    return "\n".join(lines)
