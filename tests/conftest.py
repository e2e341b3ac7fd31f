"""Shared fixtures: environment for CPU vLLM / Ray, and the tiny offline checkpoint."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_CACHE = Path(os.environ.get("AGENTRL_CACHE", Path(__file__).resolve().parents[1] / ".cache"))
os.environ.setdefault("AGENTRL_CACHE", str(_CACHE))
os.environ.setdefault("VLLM_CACHE_ROOT", str(_CACHE / "vllm"))
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "auto")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


@pytest.fixture(scope="session")
def tiny_checkpoint() -> Path:
    """A tiny random Qwen2 checkpoint + tokenizer, built once and cached on disk."""
    from agentrl.testing import default_tiny_checkpoint

    return default_tiny_checkpoint()
