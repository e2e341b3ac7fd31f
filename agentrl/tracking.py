"""Metrics sinks: console, JSONL and TensorBoard by default; W&B and MLflow when configured.

    tracker = MetricsLogger(run_dir, total_steps=cfg.trainer.total_steps)
    tracker.log(step, metrics)   # every sink; returns the scalar metrics
    tracker.close()

``metrics.jsonl`` is always written first, so a failing remote backend never loses a
step. Extra backends come from ``backends=["wandb", "mlflow"]`` or, when that is not
given, from the environment: W&B when ``WANDB_PROJECT`` is set, MLflow when
``MLFLOW_TRACKING_URI`` is set. A backend picked by the environment whose package is not
installed is skipped with a warning; one asked for by name is an error.

Every step is one console line (``agentrl.progress``: step k/N, elapsed, ETA, reward,
held-out accuracy ± SE, tool use); on a terminal a live ``rich`` bar shows the same above the
prompt. The run directory keeps everything: ``metrics.jsonl`` (every metric of every step)
and ``train.log`` (every log line of this process, and each step's main metrics).
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import yaml
from pydantic import Field
from rich import get_console
from rich.console import Console

from agentrl.core.config import Section
from agentrl.progress import TrainingProgress

logger = logging.getLogger(__name__)
# Each step's main metrics, for train.log only (the console has the progress line).
_DETAILS = logging.getLogger(f"{__name__}.details")
_DETAILS.propagate = False
_DETAILS.setLevel(logging.INFO)

DETAIL_KEYS = (
    "reward/score/mean",
    "reward/acc/mean",
    "val/score/mean",
    "val/acc/mean",
    "actor/loss",
    "actor/pg_loss",
    "mismatch/mismatch_kl",
    "rollout/response_length/mean",
    "async/staleness/mean",
    "timing/step",
)
"""Metrics written to ``train.log`` after each step's console line."""
LOG_FILE = "train.log"

BackendName = Literal["wandb", "mlflow"]
ENV_BACKENDS: dict[str, str] = {"wandb": "WANDB_PROJECT", "mlflow": "MLFLOW_TRACKING_URI"}
"""Backend → the environment variable that switches it on when ``backends`` is None."""


class TrackingConfig(Section):
    """Where metrics go besides ``metrics.jsonl`` (always written)."""

    backends: list[BackendName] | None = Field(
        None,
        description="Extra metric backends (`wandb`, `mlflow`); None = from the environment "
        "(W&B when WANDB_PROJECT is set, MLflow when MLFLOW_TRACKING_URI is set), [] = none.",
    )
    tensorboard: bool = Field(True, description="Write TensorBoard event files to the run dir.")
    progress: bool = Field(
        True, description="Live progress bar on a terminal (console lines only otherwise)."
    )


class TrackingBackend(Protocol):
    """A remote metrics sink: gets every step's scalar metrics."""

    name: str

    def log(self, step: int, scalars: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def _scalar(value: Any) -> float | None:
    try:
        number = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _run_config(run_dir: Path) -> dict[str, Any]:
    """The run's resolved config (``config.yaml``), or {} before the trainer wrote it."""
    path = run_dir / "config.yaml"
    if not path.exists():
        return {}
    loaded = yaml.safe_load(path.read_text())
    return loaded if isinstance(loaded, dict) else {}


def _import_backend(name: str, requested: bool) -> Any:
    """The backend's package; None (with a warning) if missing and not asked for by name."""
    try:
        return importlib.import_module(name)
    except ImportError:
        hint = f"the {name!r} package is not installed (pip install {name})"
        if requested:
            raise ImportError(f"tracking backend {name!r} was requested but {hint}") from None
        logger.warning("%s is set but %s: not logging to %s", ENV_BACKENDS[name], hint, name)
        return None


class WandbBackend:
    """Weights & Biases: one W&B run per run directory, named after it."""

    name = "wandb"

    def __init__(self, wandb: Any, run_dir: Path) -> None:
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT"),
            name=run_dir.name,
            dir=str(run_dir),
            config=_run_config(run_dir),
        )

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self._run.log(scalars, step=step)

    def close(self) -> None:
        self._run.finish()


class MLflowBackend:
    """MLflow: one MLflow run per run directory; the resolved config is an artifact.

    The server is ``MLFLOW_TRACKING_URI`` and the experiment ``MLFLOW_EXPERIMENT_NAME``
    (MLflow reads both itself).
    """

    name = "mlflow"

    def __init__(self, mlflow: Any, run_dir: Path) -> None:
        self._mlflow = mlflow
        self._run = mlflow.start_run(run_name=run_dir.name)
        config = run_dir / "config.yaml"
        if config.exists():
            mlflow.log_artifact(str(config))

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self._mlflow.log_metrics(scalars, step=step)

    def close(self) -> None:
        self._mlflow.end_run()


_BACKENDS = {"wandb": WandbBackend, "mlflow": MLflowBackend}


def make_backends(
    run_dir: str | Path, backends: Sequence[str | TrackingBackend] | None = None
) -> list[TrackingBackend]:
    """Backends by name (or ready objects); None = those the environment switches on."""
    run_dir = Path(run_dir)
    requested = backends is not None
    if backends is None:
        backends = [name for name, var in ENV_BACKENDS.items() if os.environ.get(var)]
    made: list[TrackingBackend] = []
    for entry in backends:
        if not isinstance(entry, str):
            made.append(entry)
            continue
        if entry not in _BACKENDS:
            raise ValueError(f"unknown tracking backend {entry!r}; choose from {sorted(_BACKENDS)}")
        module = _import_backend(entry, requested)
        if module is not None:
            made.append(_BACKENDS[entry](module, run_dir))
            logger.info("logging metrics to %s", entry)
    return made


class MetricsLogger:
    """Writes every step's metrics to ``run_dir/metrics.jsonl`` and the other sinks.

    Args:
        run_dir: the run directory (created if missing).
        tensorboard: also write TensorBoard event files (when tensorboard is installed).
        total_steps: the run's length: console lines read ``step k/N`` with an ETA, and a
            terminal shows a live progress bar.
        backends: extra backends by name (``"wandb"``, ``"mlflow"``) or ready objects;
            None = those switched on by the environment (see the module docstring).
        progress: allow the live progress bar (False: console lines only).
        console: the rich console of the progress bar (default: the global one, which
            the CLI's log handler shares, so log lines print above the bar).
        log_file: also write this process's log lines to ``run_dir/log_file`` while the
            logger is open (None: no file).
    """

    def __init__(
        self,
        run_dir: str | Path,
        tensorboard: bool = True,
        *,
        total_steps: int | None = None,
        backends: Sequence[str | TrackingBackend] | None = None,
        progress: bool = True,
        console: Console | None = None,
        log_file: str | None = LOG_FILE,
    ) -> None:
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
        self.backends = make_backends(self.run_dir, backends)
        console = console or get_console()
        live = progress and bool(total_steps) and console.is_terminal
        self.progress = TrainingProgress(total_steps, console, live=live)
        self._file_handler: logging.Handler | None = None
        if log_file:
            self._file_handler = logging.FileHandler(self.run_dir / log_file)
            self._file_handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
            )
            logging.getLogger().addHandler(self._file_handler)
            _DETAILS.addHandler(self._file_handler)
        self._closed = False

    @classmethod
    def from_config(
        cls, run_dir: str | Path, cfg: TrackingConfig, total_steps: int | None = None
    ) -> MetricsLogger:
        """A logger with the sinks ``cfg`` describes."""
        return cls(
            run_dir,
            cfg.tensorboard,
            total_steps=total_steps,
            backends=cfg.backends,
            progress=cfg.progress,
        )

    def log(self, step: int, metrics: dict[str, Any]) -> dict[str, float]:
        """Record ``metrics`` for ``step``; returns the scalar ones."""
        scalars = {k: v for k, v in ((k, _scalar(v)) for k, v in metrics.items()) if v is not None}
        record = {"step": step, "time": time.time(), **scalars}
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, step)
        for backend in list(self.backends):
            try:
                backend.log(step, scalars)
            except Exception:
                logger.exception(
                    "tracking backend %s failed at step %d; it is switched off for this run "
                    "(metrics.jsonl has every step)",
                    backend.name,
                    step,
                )
                self.backends.remove(backend)
        line = self.progress.update(step, scalars)
        if line is not None:
            logger.info("%s", line)
        shown = "  ".join(f"{k}={scalars[k]:.4g}" for k in DETAIL_KEYS if k in scalars)
        _DETAILS.info("step %d  %s", step, shown)
        return scalars

    def stop_progress(self) -> None:
        """Remove the live progress bar (console lines go on), e.g. for an evaluation."""
        self.progress.stop_live()

    def close(self) -> None:
        """Flush and close every sink (safe to call twice)."""
        if self._closed:
            return
        self._closed = True
        line = self.progress.close()
        if line is not None:
            logger.info("%s", line)
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        for backend in self.backends:
            try:
                backend.close()
            except Exception:
                logger.exception("tracking backend %s failed to close", backend.name)
        if self._file_handler is not None:
            logging.getLogger().removeHandler(self._file_handler)
            _DETAILS.removeHandler(self._file_handler)
            self._file_handler.close()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
