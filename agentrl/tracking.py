"""Metrics sinks: console, JSONL (always) and TensorBoard (when installed)."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

CONSOLE_KEYS = (
    "reward/score/mean",
    "reward/acc/mean",
    "actor/loss",
    "actor/pg_loss",
    "mismatch/mismatch_kl",
    "rollout/response_length/mean",
    "async/staleness/mean",
    "timing/step",
)


def _scalar(value: Any) -> float | None:
    try:
        number = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


class MetricsLogger:
    """Writes every step's metrics to ``run_dir/metrics.jsonl`` (+ TensorBoard)."""

    def __init__(self, run_dir: str | Path, tensorboard: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = (self.run_dir / "metrics.jsonl").open("a")
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.run_dir / "tensorboard"))
            except ImportError:
                logger.info("tensorboard not installed: metrics go to JSONL and console only")

    def log(self, step: int, metrics: dict[str, Any]) -> dict[str, float]:
        """Record ``metrics`` for ``step``; returns the scalar ones."""
        scalars = {k: v for k, v in ((k, _scalar(v)) for k, v in metrics.items()) if v is not None}
        record = {"step": step, "time": time.time(), **scalars}
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, step)
        shown = "  ".join(f"{k}={scalars[k]:.4g}" for k in CONSOLE_KEYS if k in scalars)
        logger.info("step %d  %s", step, shown)
        return scalars

    def close(self) -> None:
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
