"""Build the configured ``RolloutEngine`` backend."""

from __future__ import annotations

from agentrl.core.config import ModelConfig
from agentrl.server.config import EngineConfig
from agentrl.server.engine import RolloutEngine


def create_engine(model: ModelConfig, engine: EngineConfig) -> RolloutEngine:
    """Instantiate the backend named by ``engine.backend`` (imports it lazily)."""
    if engine.backend == "vllm":
        from agentrl.server.vllm_engine import VLLMEngine

        return VLLMEngine(model, engine)
    if engine.backend == "hf":
        from agentrl.server.hf_engine import HFEngine

        return HFEngine(model, engine)
    if engine.backend == "null":
        from agentrl.server.null_engine import NullEngine

        return NullEngine(model, engine)
    if engine.backend == "sim":
        from agentrl.server.sim_engine import SimEngine

        return SimEngine(model, engine)
    raise ValueError(
        f"unknown engine backend {engine.backend!r}; use 'vllm', 'hf', 'null' or 'sim'"
    )
