"""The gateway as a Ray Serve ingress deployment in front of the rollout servers."""

from __future__ import annotations

import logging
from typing import Any

import ray
from fastapi import FastAPI
from ray import serve
from ray.serve import Application
from ray.serve.schema import LoggingConfig
from transformers import AutoTokenizer

from agentrl.core.config import ModelConfig
from agentrl.core.trajectory import AgentLoopOutput
from agentrl.models import resolve_model_config, short_model_name
from agentrl.plugins import import_plugins_from_env, plugin_runtime_env
from agentrl.server.client import DataClient
from agentrl.server.config import ServerConfig
from agentrl.server.deployment import DEPLOYMENT_NAME
from agentrl.server.gateway.app import build_app
from agentrl.server.gateway.config import GatewayConfig
from agentrl.server.gateway.service import GatewayService
from agentrl.server.gateway.sink import InMemorySink, load_sink
from agentrl.server.launch import run_application

logger = logging.getLogger(__name__)

GATEWAY_DEPLOYMENT_NAME = "Gateway"


@serve.ingress()
class Gateway:
    """One replica holds the sessions in memory, a tokenizer, and a ``DataClient`` of
    the rollout deployment (whose affinity router then lives in this process)."""

    def __init__(
        self,
        gateway: dict[str, Any],
        model: dict[str, Any],
        server: dict[str, Any],
        namespace: str | None = None,
    ) -> None:
        import_plugins_from_env()  # the driver's `plugins:` (tool parsers, sinks, ...)
        gateway_cfg = GatewayConfig(**gateway)
        model_cfg = resolve_model_config(ModelConfig(**model))
        name, aliases = served_model_names(gateway_cfg, model["path"], model_cfg.path)
        server_cfg = ServerConfig(**server)
        tokenizer = AutoTokenizer.from_pretrained(
            model_cfg.tokenizer, trust_remote_code=model_cfg.trust_remote_code
        )
        client = DataClient.connect(
            server_cfg.name,
            DEPLOYMENT_NAME,
            max_retries=server_cfg.max_retries,
            timeout_s=gateway_cfg.request_timeout_s,
        )
        self.service = GatewayService(
            client,
            tokenizer,
            gateway_cfg,
            model_name=name,
            max_model_len=server_cfg.engine.max_model_len,
            sink=load_sink(gateway_cfg.sink, gateway_cfg.sink_capacity, namespace=namespace),
            model_aliases=aliases,
        )
        logger.info(
            "gateway ready for %s as %r (also %s; rollout app %r)",
            model_cfg.path,
            name,
            ", ".join(map(repr, aliases)),
            server_cfg.name,
        )

    def __serve_build_asgi_app__(self) -> FastAPI:
        return build_app(self.service)

    async def drain_sink(self) -> list[tuple[str, list[AgentLoopOutput], float | None]]:
        """Finished sessions held by the in-memory sink (emptied); [] for other sinks."""
        sink = self.service.sink
        return sink.drain() if isinstance(sink, InMemorySink) else []

    async def sink_stats(self) -> dict[str, int]:
        """The sink's counters (``held`` sessions not delivered yet, ...); {} for a sink
        without ``stats``."""
        stats = getattr(self.service.sink, "stats", None)
        return stats() if callable(stats) else {}


def served_model_names(
    gateway: GatewayConfig, path: str, resolved_path: str | None = None
) -> tuple[str, tuple[str, ...]]:
    """``(name, aliases)``: the model name ``/v1/models`` lists and the other names
    requests may send. The name is ``gateway.served_model_name``, else the model's short
    name (``smollm2-135m-instruct`` for ``builtin:smollm2-135m-instruct``, ``Model-1B``
    for ``Org/Model-1B``); the short name, ``model.path`` as configured and as resolved
    are always accepted."""
    name = gateway.served_model_name or short_model_name(path)
    names = dict.fromkeys((short_model_name(path), path, resolved_path or path))
    return name, tuple(n for n in names if n != name)


def build_gateway_app(
    gateway: GatewayConfig,
    model: ModelConfig,
    server: ServerConfig,
    namespace: str | None = None,
) -> Application:
    """The Serve application of the gateway (one replica; sessions live in it).

    ``namespace``: the Ray namespace in which ``gateway.sink: queue[:NAME]`` looks the
    trajectory queue actor up; None = this driver's namespace (``ray.namespace``).
    """
    if namespace is None and ray.is_initialized():
        namespace = ray.get_runtime_context().namespace
    deployment = serve.deployment(Gateway).options(
        name=GATEWAY_DEPLOYMENT_NAME,
        num_replicas=1,
        max_ongoing_requests=gateway.max_ongoing_requests,
        ray_actor_options={"num_cpus": gateway.num_cpus, "runtime_env": plugin_runtime_env()},
        graceful_shutdown_timeout_s=5,
        logging_config=LoggingConfig(enable_access_log=gateway.access_log),
    )
    return deployment.bind(gateway.model_dump(), model.model_dump(), server.model_dump(), namespace)


def gateway_url(gateway: GatewayConfig, server: ServerConfig) -> str:
    """The OpenAI ``base_url`` of the gateway (``.../v1``)."""
    prefix = gateway.route_prefix.rstrip("/")
    return f"http://{server.http_host}:{server.http_port}{prefix}/v1"


def start_gateway(
    gateway: GatewayConfig,
    model: ModelConfig,
    server: ServerConfig,
    namespace: str | None = None,
) -> str:
    """Deploy the gateway in front of running rollout servers; returns its base URL.

    Call after ``start_rollout_servers`` (which starts Serve's HTTP proxy on
    ``server.http_host:server.http_port``). ``namespace`` as in ``build_gateway_app``.
    """
    if not gateway.api_key and server.http_host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning(
            "gateway on %s without gateway.api_key: anyone who can reach it can generate",
            server.http_host,
        )
    run_application(
        build_gateway_app(gateway, model, server, namespace), gateway.app_name, gateway.route_prefix
    )
    url = gateway_url(gateway, server)
    logger.info(
        "OpenAI-compatible gateway at %s (model %r)",
        url,
        served_model_names(gateway, model.path)[0],
    )
    return url


def stop_gateway(gateway: GatewayConfig) -> None:
    """Delete the gateway application."""
    serve.delete(gateway.app_name)
