"""Whether a new run may continue the one in its run directory, and from where.

A run directory keeps the resolved config of the run that wrote it (``config.yaml``,
written by ``Trainer.setup``) next to its checkpoints. Before anything starts,
``check_resume`` decides what a run with ``trainer.resume`` does there:

- no complete checkpoint: start afresh;
- a checkpoint of a different run (any of ``RUN_IDENTITY_KEYS`` differs): stop with
  ``ResumeMismatch``, naming each key with its old and new value, unless
  ``trainer.resume_mismatch=allow``;
- a checkpoint at or past ``trainer.total_steps``: stop with ``RunFinished`` (the CLI
  prints it and exits 0), saying how to train further;
- otherwise: continue from the newest complete checkpoint.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import yaml

from agentrl.config import AgentRLConfig, ConfigError

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
"""The resolved config a run saves in its run directory."""

RUN_IDENTITY_KEYS = (
    "model.path",
    "model.tokenizer_path",
    "data.train_files",
    "data.custom_cls_path",
    "data.custom_cls_name",
    "algorithm.adv_estimator",
    "algorithm.policy_loss.loss_mode",
    "rollout.agent_name",
    "reward.reward_fn_path",
    "reward.reward_fn_name",
    "workers.actor.lora.rank",
)
"""Settings that make a different run: what is trained (model, tokenizer, LoRA or full
weights), on what (data), how (advantage estimator, policy loss) and by which agent loop
and reward. Step counts, batch and server sizes, logging and the like may change when a
run is continued."""


class ResumeMismatch(ConfigError):
    """The run directory holds a checkpoint of a run with different settings."""


class RunFinished(Exception):
    """The run directory's last checkpoint is at or past ``trainer.total_steps``."""


def checkpoint_step(checkpoint: Path) -> int:
    """The training step of a ``checkpoints/step_N`` directory."""
    return int(re.sub(r"\D", "", checkpoint.name) or 0)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint under ``run_dir/checkpoints``; None when there is none.

    A run killed while saving leaves a checkpoint without its trainer state, which rank 0
    writes last: such checkpoints are skipped with a warning.
    """
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*"), key=checkpoint_step)
    if not checkpoints:
        return None
    # Imported here: it loads torch, which the CLI's checks before a run do not need.
    from agentrl.trainer.checkpoint import TRAINER_STATE_FILE

    complete = [p for p in checkpoints if (p / TRAINER_STATE_FILE).is_file()]
    for partial in sorted(set(checkpoints) - set(complete)):
        logger.warning("ignoring incomplete checkpoint %s (the run died saving it)", partial)
    return complete[-1] if complete else None


def run_differences(saved: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{key: (saved value, new value)}`` for each of ``RUN_IDENTITY_KEYS`` that differs
    between two config trees (``model_dump(mode="json")``). A key the saved tree lacks (a
    config written before the key existed) is not compared; an unset tokenizer is the
    model's own."""
    differences = {}
    for key in RUN_IDENTITY_KEYS:
        found, old = _lookup(saved, key)
        if not found:
            continue
        _, value = _lookup(new, key)
        if key == "model.tokenizer_path":
            if old is None and value is None:
                continue  # both the model's own: model.path says it
            old = old or _lookup(saved, "model.path")[1]
            value = value or _lookup(new, "model.path")[1]
        if old != value:
            differences[key] = (old, value)
    return differences


def check_resume(cfg: AgentRLConfig) -> Path | None:
    """The checkpoint a run with ``cfg`` (resolved) continues from; None to start afresh.

    Raises:
        ResumeMismatch: the run directory's run differs in one of ``RUN_IDENTITY_KEYS``
            and ``trainer.resume_mismatch`` is ``error``.
        RunFinished: its last checkpoint is at or past ``trainer.total_steps``.
    """
    if not cfg.trainer.resume:
        return None
    run_dir = Path(cfg.trainer.run_dir)
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        return None
    if cfg.trainer.resume_mismatch == "error":
        _check_same_run(cfg, run_dir, checkpoint)
    step, total = checkpoint_step(checkpoint), cfg.trainer.total_steps
    if step >= total:
        raise RunFinished(
            f"{run_dir} is finished: its last checkpoint ({checkpoint.name}) is at step "
            f"{step} of trainer.total_steps={total}, so there is nothing to train. To train "
            f"further, run the same command with more steps (e.g. trainer.total_steps="
            f"{step + total}); to start over, give it a fresh trainer.run_dir."
        )
    return checkpoint


def _check_same_run(cfg: AgentRLConfig, run_dir: Path, checkpoint: Path) -> None:
    saved_file = run_dir / CONFIG_FILE
    if not saved_file.is_file():
        logger.warning("%s is missing: cannot check that %s is the same run", saved_file, run_dir)
        return
    saved = yaml.safe_load(saved_file.read_text()) or {}
    differences = run_differences(saved, cfg.model_dump(mode="json"))
    if not differences:
        return
    width = max(len(key) for key in differences)
    lines = [f"  {key:<{width}}  {old!r} -> {new!r}" for key, (old, new) in differences.items()]
    message = "\n".join(
        [
            f"{run_dir} holds another run: trainer.resume would continue its checkpoint "
            f"{checkpoint.name}, but these settings differ ({saved_file} -> now):",
            *lines,
            "Either train in a fresh directory (trainer.run_dir=runs/NEW_NAME), or resume "
            "from that checkpoint with the new settings anyway (trainer.resume_mismatch=allow).",
        ]
    )
    raise ResumeMismatch(message)


def _lookup(tree: dict[str, Any], key: str) -> tuple[bool, Any]:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node
