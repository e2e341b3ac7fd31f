"""Start Ray and the rollout servers from a config."""

from __future__ import annotations

import logging

import ray
from ray import serve

from agentrl.config import ModelConfig, RayConfig, ServerConfig
from agentrl.server.client import ServerClient
from agentrl.server.deployment import DEPLOYMENT_NAME, build_rollout_app

logger = logging.getLogger(__name__)


def init_ray(cfg: RayConfig) -> None:
    """Connect to ``cfg.address`` or start a local Ray instance (no dashboard)."""
    if ray.is_initialized():
        return
    ray.init(
        address=cfg.address or "local",
        num_cpus=cfg.num_cpus if cfg.address is None else None,
        include_dashboard=False,
        namespace=cfg.namespace,
        log_to_driver=True,
    )


def start_rollout_servers(
    model: ModelConfig, server: ServerConfig, actor_resources: dict[str, float] | None = None
) -> ServerClient:
    """Deploy ``server.num_replicas`` rollout replicas; returns a client once all are up.

    ``actor_resources``: custom Ray resources per replica (pins replicas to rollout nodes).
    """
    serve.start(http_options={"host": server.http_host, "port": server.http_port})
    logger.info(
        "starting %d %s rollout replica(s) of %s (router: %s)",
        server.num_replicas,
        server.engine.backend,
        model.path,
        server.router.policy,
    )
    app = build_rollout_app(model, server, actor_resources)
    serve.run(app, name=server.name, route_prefix=None)
    return ServerClient.connect(
        server.name,
        DEPLOYMENT_NAME,
        max_retries=server.max_retries,
        timeout_s=server.request_timeout_s,
    )


def stop_rollout_servers(server: ServerConfig) -> None:
    """Delete the rollout application (engines shut down with their replicas)."""
    serve.delete(server.name)
