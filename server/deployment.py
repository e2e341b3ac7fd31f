"""The ``RolloutServer`` Ray Serve deployment: one rollout engine per replica."""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from typing import Any

from ray import serve
from ray.serve import Application
from ray.serve.schema import LoggingConfig

from agentrl.core.config import ModelConfig
from agentrl.core.types import PauseMode, SamplingParams, TokenOutput
from agentrl.plugins import import_plugins_from_env, plugin_runtime_env
from agentrl.server.config import EngineConfig, ServerConfig
from agentrl.server.factory import create_engine
from agentrl.server.routing import request_router_config
from agentrl.server.weight_transport import receiver_class
from agentrl.server.weight_transport.base import WeightReceiver

logger = logging.getLogger(__name__)

DEPLOYMENT_NAME = "RolloutServer"

# Environment the engines read; forwarded to replicas so a driver's settings apply there.
_ENGINE_ENV_VARS = (
    "VLLM_CACHE_ROOT",
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_CPU_OMP_THREADS_BIND",
    "VLLM_LOGGING_LEVEL",
    "HF_HUB_OFFLINE",
    "HF_HOME",
    "TOKENIZERS_PARALLELISM",
    "AGENTRL_CACHE",
)


class RolloutServer:
    """Serves token-in/token-out generation and the control calls of one engine.

    Requests arrive through ``DataClient`` (data path, routed per session) and
    ``ControlClient`` (``handle.broadcast``: pause, resume, weight pushes, stats).
    """

    def __init__(self, model: dict[str, Any], engine: dict[str, Any]) -> None:
        import_plugins_from_env()  # the driver's `plugins:` (weight receivers, ...)
        self._engine = create_engine(ModelConfig(**model), EngineConfig(**engine))
        self._replica_id = serve.get_replica_context().replica_id.unique_id
        self._receivers: dict[str, WeightReceiver] = {}  # weight receivers by kind
        logger.info("rollout replica %s ready (%s)", self._replica_id, engine["backend"])

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        session_id: str | None = None,
        request_id: str | None = None,
        avoid_actor_ids: frozenset[str] = frozenset(),
    ) -> TokenOutput:
        """Generate for one request.

        ``session_id`` and ``avoid_actor_ids`` (replicas where earlier attempts of this
        request failed) are read by the router, not here.
        """
        out = await self._engine.generate(request_id or uuid.uuid4().hex, prompt_ids, sampling)
        out.replica_id = self._replica_id
        return out

    async def generate_batch(
        self,
        requests: list[dict[str, Any]],
        session_id: str | None = None,
        session_ids: tuple[str, ...] = (),
        avoid_actor_ids: frozenset[str] = frozenset(),
    ) -> list[TokenOutput | Exception]:
        """Generate for several requests at once (``DataClient`` coalesces them), all
        running concurrently on the engine; each gets its output or its own error.

        ``requests`` hold ``generate``'s arguments. The router reads ``session_id`` (the
        first session, which picks the replica), ``session_ids`` (the others, pinned to
        the same replica) and ``avoid_actor_ids``.
        """
        return await asyncio.gather(
            *(self.generate(**request) for request in requests), return_exceptions=True
        )

    async def abort(self, request_id: str) -> TokenOutput | None:
        """Abort ``request_id`` if this replica runs it; returns its partial output."""
        out = await self._engine.abort(request_id)
        if out is not None:
            out.replica_id = self._replica_id
        return out

    async def pause(self, mode: str = PauseMode.KEEP.value) -> str:
        await self._engine.pause(PauseMode(mode))
        return self._replica_id

    async def resume(self) -> str:
        await self._engine.resume()
        return self._replica_id

    async def reset_prefix_cache(self) -> str:
        await self._engine.reset_prefix_cache()
        return self._replica_id

    # -- weight transports (their receivers: agentrl.server.weight_transport) -----------

    async def prepare_weights(self, kind: str, step: str, *args: Any) -> Any:
        """Setup ``step`` of weight receiver ``kind`` (e.g. joining a broadcast group)."""
        return await self._receiver(kind).prepare(step, *args)

    async def swap_weights(
        self, kind: str, payload: Any, version: int, mode: str = PauseMode.KEEP.value
    ) -> float:
        """Receive a push through receiver ``kind`` and serve it as ``version``: pause →
        load → reset cache → resume.

        A staged engine (vLLM, ``weight_swap=staged``) loads the weights before pausing
        and only swaps them in while paused. Returns the seconds this replica was paused
        (no token is produced meanwhile).
        """
        return await self._receiver(kind).swap(payload, version, PauseMode(mode))

    def _receiver(self, kind: str) -> WeightReceiver:
        receiver = self._receivers.get(kind)
        if receiver is None:
            receiver = receiver_class(kind)(self._engine, self._replica_id)
            self._receivers[kind] = receiver
        return receiver

    async def stats(self) -> dict[str, Any]:
        return {"replica_id": self._replica_id, **await self._engine.stats()}

    async def __del__(self) -> None:
        await self._engine.shutdown()


def _engine_env() -> dict[str, str]:
    return {k: os.environ[k] for k in _ENGINE_ENV_VARS if k in os.environ}


def _plugin_env() -> dict[str, str]:
    return plugin_runtime_env().get("env_vars", {})


def _gpus_per_engine(engine: EngineConfig) -> int:
    """GPUs a replica of a real engine takes: its tensor-parallel size where CUDA is present."""
    import torch  # here, not at the top: replicas of modeled engines never load torch

    return engine.tensor_parallel_size if torch.cuda.is_available() else 0


def build_rollout_app(
    model: ModelConfig, server: ServerConfig, actor_resources: dict[str, float] | None = None
) -> Application:
    """The Serve application of ``server.num_replicas`` rollout replicas.

    ``actor_resources``: custom Ray resources each replica takes (rollout node pool).
    """
    engine = server.engine
    num_gpus = server.num_gpus_per_replica
    if num_gpus is None:  # a modeled (sim) or model-less (null) engine never takes one
        num_gpus = 0 if engine.backend in ("null", "sim") else _gpus_per_engine(engine)
    options: dict[str, Any] = {
        "name": DEPLOYMENT_NAME,
        "num_replicas": server.num_replicas,
        "max_ongoing_requests": server.max_ongoing_requests,
        "ray_actor_options": {
            "num_cpus": server.num_cpus_per_replica,
            "num_gpus": num_gpus,
            "runtime_env": {"env_vars": _engine_env() | _plugin_env()},
            "resources": dict(actor_resources or {}),
        },
        "health_check_period_s": 5,
        "graceful_shutdown_timeout_s": 5,
        "logging_config": LoggingConfig(enable_access_log=server.access_log),
    }
    router = request_router_config(
        server.router.policy, server.router.max_sessions, server.serve_public_path
    )
    if router is not None:
        options["request_router_config"] = router
    deployment = serve.deployment(RolloutServer).options(**options)
    return deployment.bind(model.model_dump(), engine.model_dump())
