"""SDPA for shapes that change every call: the engine's decoding and the actor's packed
forwards run without the cuDNN backend, whose per-shape plans made bf16 decoding 13-20x
slower on an H200 (agentrl/models/attention.py)."""

from __future__ import annotations

import asyncio
import socket

import torch
import torch.distributed as dist

from agentrl.core.config import ModelConfig
from agentrl.core.types import SamplingParams
from agentrl.models.attention import varying_shape_attention
from agentrl.server import hf_engine
from agentrl.server.config import EngineConfig


def sdpa_flags() -> dict[str, bool]:
    cuda = torch.backends.cuda
    return {
        "cudnn": cuda.cudnn_sdp_enabled(),
        "flash": cuda.flash_sdp_enabled(),
        "efficient": cuda.mem_efficient_sdp_enabled(),
        "math": cuda.math_sdp_enabled(),
    }


def test_context_turns_off_only_cudnn_and_restores_it():
    before = sdpa_flags()
    assert before["cudnn"], "torch's default enables cuDNN SDPA; the test needs it on"
    with varying_shape_attention():
        assert sdpa_flags() == {"cudnn": False, "flash": True, "efficient": True, "math": True}
    assert sdpa_flags() == before


def test_decorator_applies_on_every_call():
    seen: list[bool] = []

    @varying_shape_attention()
    def forward() -> None:
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())

    forward()
    forward()
    assert seen == [False, False]
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_engine_prefills_and_decodes_without_cudnn(tiny_checkpoint, monkeypatch):
    seen: list[tuple[str, bool]] = []
    prefill, step = hf_engine.prefill, hf_engine.DecodeBatch.step

    def recording_prefill(*args, **kwargs):
        seen.append(("prefill", torch.backends.cuda.cudnn_sdp_enabled()))
        return prefill(*args, **kwargs)

    def recording_step(self, *args, **kwargs):
        seen.append(("decode", torch.backends.cuda.cudnn_sdp_enabled()))
        return step(self, *args, **kwargs)

    monkeypatch.setattr(hf_engine, "prefill", recording_prefill)
    monkeypatch.setattr(hf_engine.DecodeBatch, "step", recording_step)

    async def run() -> list[int]:
        engine = hf_engine.HFEngine(
            ModelConfig(path=str(tiny_checkpoint)), EngineConfig(backend="hf", max_model_len=128)
        )
        try:
            greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
            return (await engine.generate("r", [5, 17, 40, 3], greedy)).token_ids
        finally:
            await engine.shutdown()

    assert len(asyncio.run(run())) == 4
    assert {kind for kind, _ in seen} == {"prefill", "decode"}
    assert not any(enabled for _, enabled in seen), seen
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_actor_forwards_without_cudnn(tiny_checkpoint):
    from agentrl.algos import AlgorithmConfig
    from agentrl.trainer.config import ActorConfig
    from agentrl.trainer.dispatch import shard_mini_batches
    from agentrl.trainer.fsdp_worker import ActorWorker
    from agentrl.trainer.losses import make_actor_loss

    worker = ActorWorker(ActorConfig(mini_batch_size=2), str(tiny_checkpoint), rank=0, world_size=1)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    worker.setup("127.0.0.1", port)
    try:
        seen: list[bool] = []
        worker.model.register_forward_pre_hook(
            lambda *_: seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        )
        ids = torch.tensor([[0, 5, 17, 40, 3, 9, 8], [6, 7, 8, 9, 10, 11, 12]])
        batch = {
            "input_ids": ids,
            "attention_mask": (ids > 0).long(),
            "response_mask": torch.ones(2, 3),
            "advantages": torch.tensor([[1.0] * 3, [-1.0] * 3]),
        }
        old = worker.compute_log_prob(batch)["log_probs"]
        shards, _ = shard_mini_batches({**batch, "old_log_probs": old}, 1, 2)
        metrics = worker.update_actor(shards[0], make_actor_loss(AlgorithmConfig()))
    finally:
        dist.destroy_process_group()
    assert metrics["actor/num_optimizer_steps"] == 1.0
    assert len(seen) >= 2 and not any(seen), seen
    assert torch.backends.cuda.cudnn_sdp_enabled()
