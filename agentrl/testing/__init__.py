"""Test and benchmark helpers: scripted engines and clients, toy loops and tools, the
shared tiny checkpoint, and the runner of the ``bench/`` scripts."""

from pathlib import Path

from agentrl.models import BUILTIN_PREFIX, resolve_model_path


def default_tiny_checkpoint() -> Path:
    """The shared tiny checkpoint (``builtin:tiny-qwen2``, built once under
    ``$AGENTRL_CACHE``, default ``~/.cache/agentrl``)."""
    return Path(resolve_model_path(f"{BUILTIN_PREFIX}tiny-qwen2"))


__all__ = ["default_tiny_checkpoint"]
