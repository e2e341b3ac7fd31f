"""Test helpers: tiny models and tokenizers built locally, with no download."""

from agentrl.testing.tiny_model import build_tiny_checkpoint, default_tiny_checkpoint

__all__ = ["build_tiny_checkpoint", "default_tiny_checkpoint"]
