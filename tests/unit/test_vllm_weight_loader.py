"""VLLMWeightLoader over a stand-in AsyncLLM: the order of a swap's worker calls, pauses and
labels, staged and in place, and the checks that keep the old weights serving.

The engine is a real ``VLLMEngine`` whose ``AsyncLLM`` is replaced by ``_FakeLLM``, which
records every call and answers as the workers would; no model is loaded.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from agentrl.core.config import ModelConfig
from agentrl.core.types import PauseMode, RolloutError
from agentrl.server.engine import WorkerWeights
from agentrl.server.vllm_engine import VLLMEngine
from agentrl.server.vllm_weights import VLLMWeightLoader, hf_parameter_shapes

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


class _FakeLLM:
    """Records what the engine asks of vLLM (``calls``); the workers' answers are canned,
    and a staging fails with ``stage_error``."""

    def __init__(self, stage_error: str | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.stage_error = stage_error
        self.engine_core = SimpleNamespace(pause_scheduler_async=self._pause_scheduler)
        parallel = SimpleNamespace(
            tensor_parallel_size=1, pipeline_parallel_size=1, distributed_executor_backend="mp"
        )
        self.vllm_config = SimpleNamespace(parallel_config=parallel)

    async def collective_rpc(self, method: str, timeout: Any = None, args: tuple = ()) -> list:
        self.calls.append((method, *args))
        answers: dict[str, Any] = {
            "agentrl_packed_modules": PACKED,
            "agentrl_stage_init": 1024,
            "agentrl_stage_poll": [True, self.stage_error, 3],
            "agentrl_reload_from": 5,
        }
        return [answers.get(method, True)]

    async def _pause_scheduler(self, mode: str, clear_cache: bool) -> None:
        self.calls.append(("pause", mode))

    async def pause_generation(self, mode: str, clear_cache: bool) -> None:
        self.calls.append(("pause", mode))

    async def resume_generation(self) -> None:
        self.calls.append(("resume",))

    async def update_weight_version(self, label: str) -> None:
        self.calls.append(("label", label))

    async def reset_prefix_cache(self, reset_running_requests: bool) -> bool:
        self.calls.append(("reset_prefix_cache",))
        return True


def _engine(
    checkpoint: Any, staged: bool, stage_error: str | None = None
) -> tuple[VLLMEngine, _FakeLLM]:
    """A ``VLLMEngine`` serving ``_FakeLLM`` (what ``__init__`` sets, without vLLM)."""
    engine = VLLMEngine.__new__(VLLMEngine)
    engine.llm = llm = _FakeLLM(stage_error)
    engine.control = asyncio.Lock()
    engine._paused = engine._closed = False
    engine.weight_loader = VLLMWeightLoader(engine, ModelConfig(path=str(checkpoint)), staged)
    return engine, llm


def _state(checkpoint: Any) -> list[tuple[str, torch.Tensor]]:
    shapes = hf_parameter_shapes(ModelConfig(path=str(checkpoint)))
    return [(name, torch.zeros(shape)) for name, shape in shapes.items()]


def _names(calls: list[tuple[Any, ...]]) -> list[Any]:
    return [call[0] for call in calls if call[0] != "agentrl_stage_poll"]


async def test_a_staged_swap_loads_before_pausing_and_pauses_only_to_commit(tiny_checkpoint):
    engine, llm = _engine(tiny_checkpoint, staged=True)

    paused_s = await engine.swap_weights([_state(tiny_checkpoint)], 3, PauseMode.KEEP)

    assert _names(llm.calls) == [
        "agentrl_stage_init",
        "agentrl_packed_modules",
        "agentrl_stage_begin",
        "pause",
        "agentrl_stage_commit",
        "label",
        "reset_prefix_cache",
        "resume",
    ]
    (begin,) = [call for call in llm.calls if call[0] == "agentrl_stage_begin"]
    assert begin[1]["kind"] == "shm" and begin[2] is True  # a fresh staging, through /dev/shm
    assert ("label", "3") in llm.calls and ("pause", "keep") in llm.calls
    assert engine.weight_version == 3 and paused_s >= 0
    assert engine.weight_loader.updates == 1
    timings = engine.weight_loader.last_swap_timings
    assert set(timings) == {
        "pause_wait_s",
        "swap_s",
        "label_s",
        "reset_cache_s",
        "resume_s",
        "total_s",
        "paused_s",
    }


async def test_an_in_place_update_is_one_reload_inside_one_pause(tiny_checkpoint):
    engine, llm = _engine(tiny_checkpoint, staged=False)

    await engine.update_weights(_state(tiny_checkpoint), 2)

    assert _names(llm.calls) == [
        "agentrl_packed_modules",
        "pause",
        "agentrl_reload_begin",
        "agentrl_load_weights",
        "agentrl_reload_end",
        "label",
        "resume",
    ]
    assert engine.weight_version == 2 and not engine.paused


async def test_an_in_place_swap_from_the_workers_reloads_between_pause_and_resume(
    tiny_checkpoint,
):
    engine, llm = _engine(tiny_checkpoint, staged=False)
    source = {"kind": "broadcast", "plans": []}

    await engine.swap_weights(WorkerWeights(source), 7, PauseMode.ABORT)

    assert _names(llm.calls) == [
        "pause",
        "agentrl_reload_from",
        "label",
        "reset_prefix_cache",
        "resume",
    ]
    assert ("pause", "abort") in llm.calls and ("agentrl_reload_from", source) in llm.calls
    assert engine.weight_version == 7 and not engine.paused


async def test_wrong_or_partial_weights_are_rejected_before_anything_loads(tiny_checkpoint):
    engine, llm = _engine(tiny_checkpoint, staged=False)
    state = _state(tiny_checkpoint)
    with pytest.raises(RolloutError, match="unknown parameter 'nope'"):
        await engine.update_weights([("nope", torch.zeros(1))], 1)
    name, tensor = state[0]
    with pytest.raises(RolloutError, match="has shape"):
        await engine.update_weights([(name, torch.zeros(*tensor.shape, 2))], 1)
    q_proj = [(n, t) for n, t in state if n.endswith("layers.0.self_attn.q_proj.weight")]
    with pytest.raises(RolloutError, match="partial update of vLLM module"):
        await engine.update_weights(q_proj, 1)
    assert _names(llm.calls) == ["agentrl_packed_modules"]
    assert engine.weight_version == 0


async def test_a_failed_staging_keeps_the_old_version_serving_without_pausing(tiny_checkpoint):
    engine, llm = _engine(tiny_checkpoint, staged=True, stage_error="RuntimeError: boom")
    with pytest.raises(RuntimeError, match="version 0 keeps serving: RuntimeError: boom"):
        await engine.swap_weights([_state(tiny_checkpoint)], 1)
    assert "pause" not in _names(llm.calls) and "agentrl_stage_commit" not in _names(llm.calls)
    assert engine.weight_version == 0


async def test_the_workers_are_one_rank_each_in_the_model_dtype(tiny_checkpoint):
    engine, llm = _engine(tiny_checkpoint, staged=False)
    workers = engine.weight_workers()
    assert workers.num_workers == 1 and workers.dtype == ModelConfig().dtype
    await workers.call("broadcast", "leave", timeout=5)
    assert llm.calls[-1] == ("agentrl_receiver_call", "broadcast", "leave")
