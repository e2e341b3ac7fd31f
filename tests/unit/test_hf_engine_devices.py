"""HFEngine off the CPU: the decode batch's KV bookkeeping stays on the cache's device, rows
are re-indexed only when one leaves, sampling draws from the request's seeded CPU generator
wherever the logits are, and ``engine.hf_device`` picks where the model lives.

The CPU tests check device propagation with the ``meta`` device; the ``cuda`` tests run only
where torch sees a GPU (``pytest tests/unit/test_hf_engine_devices.py -k cuda``).
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch
from torch.overrides import TorchFunctionMode

from agentrl.core.config import ModelConfig
from agentrl.core.types import SamplingParams
from agentrl.server import hf_engine, hf_kv
from agentrl.server.config import EngineConfig
from agentrl.server.hf_kv import DecodeBatch
from agentrl.server.hf_sampling import _top_k, _top_p, make_generator, sample_token

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
SAMPLED = SamplingParams(
    max_tokens=8, temperature=0.8, top_k=40, top_p=0.9, seed=11, ignore_eos=True
)


def _kv(length: int, device: str, fill: float = 0.0) -> hf_kv.KV:
    """Two layers of ``[1, kv_heads=2, length, head_dim=4]`` keys and values."""
    shape = (1, 2, length, 4)
    return [
        (torch.full(shape, fill, device=device), torch.full(shape, -fill, device=device))
        for _ in range(2)
    ]


def _batch(lengths: list[int], device: str) -> DecodeBatch[str]:
    batch: DecodeBatch[str] = DecodeBatch()
    batch.add([(f"row{i}", _kv(n, device, fill=i + 1.0)) for i, n in enumerate(lengths)])
    return batch


class _MixedDevices(TorchFunctionMode):
    """Records every torch call whose tensor arguments are on more than one device."""

    def __init__(self) -> None:
        super().__init__()
        self.mixed: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        devices = {
            a.device
            for a in [*args, *kwargs.values()]
            if isinstance(a, torch.Tensor | torch.Generator)
        }
        if len(devices) > 1:
            self.mixed.append(f"{getattr(func, '__name__', func)}: {sorted(map(str, devices))}")
        return func(*args, **kwargs)


# -- DecodeBatch.remove ------------------------------------------------------------------------


def test_remove_with_no_finished_row_keeps_the_cache():
    batch = _batch([3, 5], "cpu")
    cache = batch._cache
    assert batch.remove([]) == []
    assert batch.remove(["not-a-row"]) == []
    assert batch._cache is cache, "the KV cache was rebuilt although no row left"
    assert batch.items == ["row0", "row1"] and batch.width == 5


def test_remove_builds_its_row_index_on_the_cache_device():
    batch = _batch([3, 5, 4], "meta")
    with _MixedDevices() as mode:
        removed = batch.remove(["row1"])
    assert mode.mixed == [], f"CPU tensors met the meta KV cache: {mode.mixed}"
    assert [item for item, _ in removed] == ["row1"]
    assert removed[0][1][0][0].shape == (1, 2, 5, 4)
    assert batch.items == ["row0", "row2"] and batch.width == 4
    keys = batch._cache.layers[0].keys
    assert keys.device.type == "meta" and keys.shape == (2, 2, 4, 4)


def test_remove_keeps_the_right_rows():
    batch = _batch([3, 5, 4], "cpu")
    batch.remove(["row1"])
    keys = batch._cache.layers[1].keys
    assert torch.equal(keys[0, :, 1:], torch.full((2, 3, 4), 1.0))  # row0, left-padded by 1
    assert torch.equal(keys[0, :, :1], torch.zeros(2, 1, 4))
    assert torch.equal(keys[1], torch.full((2, 4, 4), 3.0))  # row2


# -- HFEngine: the cache is re-indexed only when a row leaves ----------------------------------


async def test_engine_removes_rows_only_when_one_finished(tiny_checkpoint, monkeypatch):
    calls: list[int] = []
    original = DecodeBatch.remove

    def remove(self, items):
        calls.append(len(items))
        return original(self, items)

    monkeypatch.setattr(DecodeBatch, "remove", remove)
    engine = hf_engine.HFEngine(
        ModelConfig(path=str(tiny_checkpoint)),
        EngineConfig(backend="hf", max_model_len=256, hf_prefix_cache_entries=0),
    )
    try:
        lengths = [3, 9, 14]
        outs = await asyncio.gather(
            *[
                engine.generate(
                    f"r{i}",
                    [5 + i, 17, 40, 3],
                    SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True),
                )
                for i, n in enumerate(lengths)
            ]
        )
        assert [len(o.token_ids) for o in outs] == lengths
        stats = await engine.stats()
    finally:
        await engine.shutdown()
    assert stats["decode_steps"] >= max(lengths) - 1
    assert calls and all(n > 0 for n in calls), f"remove called with no finished row: {calls}"
    assert sum(calls) == len(lengths)


# -- sampling ------------------------------------------------------------------------------------


def _reference_tokens(logits: torch.Tensor, sampling: SamplingParams, draws: int) -> list[int]:
    """The draws as ``sample_token`` made them before this change: CPU multinomial, CPU
    generator seeded with the request's seed."""
    generator = make_generator(sampling.seed)
    scores = _top_p(_top_k(logits.float() / sampling.temperature, sampling.top_k), sampling.top_p)
    probs = torch.softmax(scores, dim=-1)
    return [int(torch.multinomial(probs, 1, generator=generator)) for _ in range(draws)]


def test_seeded_sampling_is_unchanged_on_cpu():
    logits = torch.randn(300, generator=torch.Generator().manual_seed(0))
    generator = make_generator(SAMPLED.seed)
    drawn = [sample_token(logits, SAMPLED, generator)[0] for _ in range(20)]
    assert drawn == _reference_tokens(logits, SAMPLED, 20)
    assert len(set(drawn)) > 1


def test_sampling_draws_on_the_generator_device(monkeypatch):
    seen: list[tuple[torch.device, torch.device]] = []
    multinomial = torch.multinomial

    def spy(probs, num_samples, *, generator):
        seen.append((probs.device, generator.device))
        return multinomial(probs, num_samples, generator=generator)

    monkeypatch.setattr(torch, "multinomial", spy)
    logits = torch.randn(50, generator=torch.Generator().manual_seed(1))
    sample_token(logits, SAMPLED, make_generator(0))
    assert seen == [(torch.device("cpu"), torch.device("cpu"))]


# -- engine.hf_device --------------------------------------------------------------------------


def test_hf_device_resolution(monkeypatch):
    assert EngineConfig().hf_device == "auto"
    assert hf_engine._resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert hf_engine._resolve_device("auto") == torch.device("cpu")
    with pytest.raises(RuntimeError, match="sees no GPU"):
        hf_engine._resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert hf_engine._resolve_device("auto") == torch.device("cuda", 0)
    with pytest.raises(ValueError):
        EngineConfig(hf_device="tpu")


def test_hf_device_cpu_engine(tiny_checkpoint):
    engine = hf_engine.HFEngine(
        ModelConfig(path=str(tiny_checkpoint)), EngineConfig(backend="hf", hf_device="cpu")
    )
    assert engine.device == torch.device("cpu")
    assert engine._model.device == torch.device("cpu")


# -- on a GPU --------------------------------------------------------------------------------


@needs_cuda
def test_cuda_decode_batch_remove():
    batch = _batch([3, 5, 4], "cuda")
    cache = batch._cache
    assert batch.remove([]) == [] and batch._cache is cache
    removed = batch.remove(["row1"])
    assert removed[0][1][0][0].device.type == "cuda"
    keys = batch._cache.layers[0].keys
    assert keys.device.type == "cuda" and keys.shape == (2, 2, 4, 4)


@needs_cuda
def test_cuda_seeded_sampling_matches_cpu():
    logits = torch.randn(300, generator=torch.Generator().manual_seed(0))
    generator = make_generator(SAMPLED.seed)
    drawn = [sample_token(logits.cuda(), SAMPLED, generator)[0] for _ in range(20)]
    assert drawn == _reference_tokens(logits, SAMPLED, 20)


@needs_cuda
def test_cuda_engine_sampled_and_greedy():
    from agentrl.testing import default_tiny_checkpoint

    async def run():
        engine = hf_engine.HFEngine(
            ModelConfig(path=str(default_tiny_checkpoint())),
            EngineConfig(backend="hf", max_model_len=256, hf_prefix_cache_entries=0),
        )
        try:
            assert engine._model.device.type == "cuda"
            greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
            prompts = [[5, 17, 40, 3], [9, 8, 7, 6, 5, 4, 3]]
            mixed = [SAMPLED, greedy, dataclasses.replace(SAMPLED, max_tokens=3)]
            outs = await asyncio.gather(
                *[engine.generate(f"r{i}", prompts[i % 2], s) for i, s in enumerate(mixed)]
            )
            again = await engine.generate("again", prompts[0], SAMPLED)
        finally:
            await engine.shutdown()
        assert [len(o.token_ids) for o in outs] == [8, 6, 3]
        assert again.token_ids == outs[0].token_ids  # same seed, same tokens

    asyncio.run(run())
