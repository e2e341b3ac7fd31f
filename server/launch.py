"""Start Ray and the rollout servers from a config."""

from __future__ import annotations

import contextlib
import logging
import os
import re

import psutil
import ray
from ray import serve
from ray.serve import Application

from agentrl.core.config import ModelConfig, RayConfig
from agentrl.core.console import quiet_ray_auth_notice, quiet_serve_logs
from agentrl.models import resolve_model_config
from agentrl.server.client import ServerClient
from agentrl.server.config import ServerConfig
from agentrl.server.deployment import build_rollout_app

logger = logging.getLogger(__name__)

LOCAL_START_ATTEMPTS = 3
# The start failures a new attempt recovers from: the raylet not registering within Ray's
# fixed 30 s, and a GCS server that never writes its port file (seen when the process
# forks its GCS while threads of an earlier local instance are still winding down).
_RETRIED_START_ERRORS = ("timed out during startup", "Timed out waiting for file")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b.*")


class DeploymentError(RuntimeError):
    """A Serve application did not start; the message carries its replicas' own error."""

    def __init__(self, app_name: str, cause: str, details: str) -> None:
        super().__init__(
            f"deploying Serve application {app_name!r} failed: {cause}"
            + (f"\n\n{details}" if details else "")
        )
        self.app_name = app_name
        self.cause = cause
        self.details = details


def _last_exception_line(text: str) -> str | None:
    """The final ``SomeError: message`` line of a traceback text, if any."""
    lines = [line for line in text.splitlines() if _EXCEPTION_LINE.match(line)]
    return lines[-1].strip() if lines else None


def deployment_failure(app_name: str, fallback: str) -> DeploymentError:
    """A ``DeploymentError`` for ``app_name`` from ``serve.status()``: the failing
    deployments' messages (a replica's constructor traceback) and their last exception
    line as the cause. ``fallback`` is used when the status says nothing more."""
    try:
        app = serve.status().applications.get(app_name)
    except Exception as exc:  # the controller itself may be gone
        logger.debug("serve.status() failed: %s", exc)
        app = None
    details, causes = [], []
    if app is not None:
        for name, deployment in app.deployments.items():
            message = _ANSI.sub("", deployment.message or "").strip()
            if not message or deployment.status == "HEALTHY":
                continue
            status = getattr(deployment.status, "value", deployment.status)
            details.append(f"deployment {name} ({status}): {message}")
            line = _last_exception_line(message)
            if line:
                causes.append(line)
        if not details and app.message:
            details.append(_ANSI.sub("", app.message).strip())
    cause = "; ".join(dict.fromkeys(causes)) or fallback
    return DeploymentError(app_name, cause, "\n".join(details))


def run_application(app: Application, name: str, route_prefix: str | None) -> None:
    """``serve.run`` that raises ``DeploymentError`` naming the replicas' own error
    (``serve.run`` alone says only that the deployment failed)."""
    try:
        serve.run(app, name=name, route_prefix=route_prefix)
    except RuntimeError as exc:
        raise deployment_failure(name, str(exc)) from exc


def init_ray(cfg: RayConfig) -> None:
    """Connect to ``cfg.address`` or start a local Ray instance (no dashboard).

    A local start whose raylet does not register within Ray's fixed 30 s, or whose GCS
    never writes its port, is retried (``LOCAL_START_ATTEMPTS`` in all) after the failed
    start's processes are killed.
    """
    if ray.is_initialized():
        return
    if not cfg.log_to_driver:
        quiet_serve_logs()  # as the CLI does, for agentrl.rollout and friends too
    quiet_ray_auth_notice()
    init_kwargs = dict(
        address=cfg.address or "local",
        num_cpus=cfg.num_cpus if cfg.address is None else None,
        include_dashboard=False,
        namespace=cfg.namespace,
        log_to_driver=cfg.log_to_driver,
    )
    if cfg.address is None:
        _start_local_ray(init_kwargs)
    else:
        ray.init(**init_kwargs)
    if not cfg.log_to_driver:
        logger.info(
            "Ray workers' logs: %s (ray.log_to_driver=true or -v shows them here)",
            f"{os.environ.get('RAY_TMPDIR', '/tmp/ray')}/session_latest/logs"
            if cfg.address is None
            else "each node's Ray logs",
        )


def _start_local_ray(init_kwargs: dict) -> None:
    """``ray.init`` of a new local instance, retried when its node times out starting.

    Ray gives a new node's raylet a fixed 30 s to register with its GCS and then raises,
    leaving the GCS, raylet and agents it started running; it also raises when the GCS
    it started never writes its port file. On a loaded 2-core machine (a previous
    instance's engine processes still exiting) both have happened in CI; the next
    attempt, with the leftovers killed, starts normally.
    """
    for attempt in range(1, LOCAL_START_ATTEMPTS + 1):
        already_running = {child.pid for child in psutil.Process().children(recursive=True)}
        try:
            ray.init(**init_kwargs)
            return
        except Exception as exc:  # Ray raises a bare Exception for this timeout
            retried = any(marker in str(exc) for marker in _RETRIED_START_ERRORS)
            if not retried or attempt == LOCAL_START_ATTEMPTS:
                raise
            killed = _kill_processes_started_since(already_running)
            logger.warning(
                "local Ray instance did not start (%s); killed its %d processes, "
                "starting again (attempt %d of %d)",
                exc,
                killed,
                attempt + 1,
                LOCAL_START_ATTEMPTS,
            )


def _kill_processes_started_since(already_running: set[int]) -> int:
    """Kill this process's descendants not in ``already_running``; returns how many."""
    started = [
        child
        for child in psutil.Process().children(recursive=True)
        if child.pid not in already_running
    ]
    for child in started:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(started, timeout=10)
    return len(started)


def start_rollout_servers(
    model: ModelConfig, server: ServerConfig, actor_resources: dict[str, float] | None = None
) -> ServerClient:
    """Deploy ``server.num_replicas`` rollout replicas; returns a client once all are up.

    ``model.path`` may be anything the CLI accepts (an HF id, a directory or
    ``builtin:<name>``). ``actor_resources``: custom Ray resources per replica (pins
    replicas to rollout nodes). A replica that fails to start raises ``DeploymentError``
    with the replica's own error (e.g. a model path that does not load).
    """
    model = resolve_model_config(model)
    serve.start(http_options={"host": server.http_host, "port": server.http_port})
    logger.info(
        "starting %d %s rollout replica(s) of %s (router: %s)",
        server.num_replicas,
        server.engine.backend,
        model.path,
        server.router.policy,
    )
    app = build_rollout_app(model, server, actor_resources)
    run_application(app, server.name, route_prefix=None)
    return ServerClient.from_config(server)


def stop_rollout_servers(server: ServerConfig) -> None:
    """Delete the rollout application (engines shut down with their replicas)."""
    serve.delete(server.name)
