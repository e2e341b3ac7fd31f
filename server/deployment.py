"""The ``RolloutServer`` Ray Serve deployment: one rollout engine per replica."""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

import ray
import torch
from ray import serve
from ray.serve import Application
from ray.serve.schema import LoggingConfig

from agentrl.core.config import ModelConfig
from agentrl.core.types import PauseMode, SamplingParams, TokenOutput
from agentrl.server.collective import node_ip
from agentrl.server.config import EngineConfig, ServerConfig
from agentrl.server.factory import create_engine
from agentrl.server.routing import request_router_config

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

    Requests arrive through ``ServerClient`` (data path, routed per session) and
    ``handle.broadcast`` (control path: pause, resume, update_weights, ...).
    """

    def __init__(self, model: dict[str, Any], engine: dict[str, Any]) -> None:
        self._engine = create_engine(ModelConfig(**model), EngineConfig(**engine))
        self._replica_id = serve.get_replica_context().replica_id.unique_id
        self._group_id: str | None = None  # weight-broadcast group this replica is in
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

    async def update_weights(self, weights: list[ray.ObjectRef], version: int) -> str:
        """Load ``(name, tensor)`` pairs stored once in the object store (``weights[0]``)."""
        named_tensors = await weights[0]
        await self._engine.update_weights(named_tensors, version)
        return self._replica_id

    async def swap_weights(
        self, weights: list[ray.ObjectRef], version: int, mode: str = PauseMode.KEEP.value
    ) -> float:
        """Fetch the buckets, then pause → load them as ``version`` → reset cache → resume.

        A staged engine (vLLM, ``weight_swap=staged``) loads them before pausing and only
        swaps them in while paused. Returns the seconds this replica was paused (no token
        is produced meanwhile).
        """
        buckets = [await ref for ref in weights]
        return await self._engine.swap_weights(buckets, version, PauseMode(mode))

    async def reset_prefix_cache(self) -> str:
        await self._engine.reset_prefix_cache()
        return self._replica_id

    # -- collective weight sync (agentrl.weight_sync.CollectiveBroadcastSync) --------------

    async def collective_info(self) -> dict[str, Any]:
        """This replica's id, node IP, ranks it adds to a weight-broadcast group, dtype."""
        return {
            "replica_id": self._replica_id,
            "node_ip": node_ip(),
            "group_id": self._group_id,
            **self._engine.weight_group_info(),
        }

    async def collective_join(self, spec: dict[str, Any], first_ranks: dict[str, int]) -> str:
        """Join the group ``spec`` at the rank ``first_ranks`` gives this replica."""
        first_rank = first_ranks.get(self._replica_id)
        if first_rank is None:
            raise RuntimeError(
                f"rollout replica {self._replica_id} has no rank in weight-broadcast group "
                f"{spec['group_id']} (it started after the group was planned); retry the push"
            )
        self._group_id = None
        await self._engine.join_weight_group(spec, first_rank, node_ip())
        self._group_id = spec["group_id"]
        return self._replica_id

    async def collective_check(self, plans: list[Any]) -> str:
        await self._engine.check_weight_plans(plans)
        return self._replica_id

    async def collective_swap(
        self, group_id: str, plans: list[Any], version: int, mode: str = PauseMode.KEEP.value
    ) -> float:
        """Receive the broadcast ``plans`` as ``version``, with a pause → reset → resume.

        A staged engine receives and loads them while generating and pauses only for the
        swap; otherwise the pause covers the broadcast, which starts once every replica
        paused. Returns the seconds this replica was paused.
        """
        if group_id != self._group_id:
            raise RuntimeError(
                f"rollout replica {self._replica_id} is in weight-broadcast group "
                f"{self._group_id}, not {group_id}"
            )
        return await self._engine.swap_received_weights(plans, version, PauseMode(mode))

    async def collective_leave(self) -> str:
        self._group_id = None
        await self._engine.leave_weight_group()
        return self._replica_id

    async def stats(self) -> dict[str, Any]:
        return {"replica_id": self._replica_id, **await self._engine.stats()}

    async def __del__(self) -> None:
        await self._engine.shutdown()


def _engine_env() -> dict[str, str]:
    return {k: os.environ[k] for k in _ENGINE_ENV_VARS if k in os.environ}


def build_rollout_app(
    model: ModelConfig, server: ServerConfig, actor_resources: dict[str, float] | None = None
) -> Application:
    """The Serve application of ``server.num_replicas`` rollout replicas.

    ``actor_resources``: custom Ray resources each replica takes (rollout node pool).
    """
    engine = server.engine
    num_gpus = server.num_gpus_per_replica
    if num_gpus is None:
        num_gpus = engine.tensor_parallel_size if torch.cuda.is_available() else 0
    options: dict[str, Any] = {
        "name": DEPLOYMENT_NAME,
        "num_replicas": server.num_replicas,
        "max_ongoing_requests": server.max_ongoing_requests,
        "ray_actor_options": {
            "num_cpus": server.num_cpus_per_replica,
            "num_gpus": num_gpus,
            "runtime_env": {"env_vars": _engine_env()},
            "resources": dict(actor_resources or {}),
        },
        "health_check_period_s": 5,
        "graceful_shutdown_timeout_s": 5,
        "logging_config": LoggingConfig(enable_access_log=server.access_log),
    }
    router = request_router_config(server.router.policy, server.router.max_sessions)
    if router is not None:
        options["request_router_config"] = router
    deployment = serve.deployment(RolloutServer).options(**options)
    return deployment.bind(model.model_dump(), engine.model_dump())
