"""What a test of an agent loop needs without a model: a scripted client in place of the
rollout servers, the context a worker gives a loop, the shared tiny checkpoint, toy loops
and tools, and real tokenizers of several model families built offline.

    from agentrl.testing import ScriptedClient, default_tiny_checkpoint, loop_context

    client = ScriptedClient(lambda session_id, turn, prompt_ids: [...])  # the "model"
    loop = MyLoop(loop_context(tokenizer, client))
    out = await loop.run(row, agentrl.SamplingParams(max_tokens=64))

Every name loads on first use, from the module that defines it: importing
``agentrl.testing`` loads no torch, Ray, vLLM or transformers. The modules here also hold
the helpers of the repository's own tests and benchmarks (``serving``, ``benchmarks``,
``faults``, ...), importable by their paths.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

# name -> the module that defines it
_EXPORTS = {
    "ScriptedClient": "agentrl.testing.scripted",
    "ScriptedCall": "agentrl.testing.scripted",
    "loop_context": "agentrl.testing.context",
    "MultiTurnChatLoop": "agentrl.testing.loops",
    "ADD_TOOL_SCHEMA": "agentrl.testing.tools",
    "family": "agentrl.testing.families",
    "ModelFamily": "agentrl.testing.families",
    "FAMILIES": "agentrl.testing.families",
    "FidelityHarness": "agentrl.testing.fidelity",
    "random_conversation": "agentrl.testing.fidelity",
}

__all__ = [
    "ADD_TOOL_SCHEMA",
    "FAMILIES",
    "FidelityHarness",
    "ModelFamily",
    "MultiTurnChatLoop",
    "ScriptedCall",
    "ScriptedClient",
    "default_tiny_checkpoint",
    "family",
    "loop_context",
    "random_conversation",
]

if TYPE_CHECKING:
    from agentrl.testing.context import loop_context
    from agentrl.testing.families import FAMILIES, ModelFamily, family
    from agentrl.testing.fidelity import FidelityHarness, random_conversation
    from agentrl.testing.loops import MultiTurnChatLoop
    from agentrl.testing.scripted import ScriptedCall, ScriptedClient
    from agentrl.testing.tools import ADD_TOOL_SCHEMA


def default_tiny_checkpoint() -> Path:
    """The path of the shared tiny checkpoint (``builtin:tiny-qwen2``: a random 2-layer
    Qwen2-style model and its tokenizer, with a ChatML chat template that renders tools),
    built offline on first use under ``$AGENTRL_CACHE`` (default ``~/.cache/agentrl``) and
    reused after."""
    from agentrl.models import BUILTIN_PREFIX, resolve_model_path

    return Path(resolve_model_path(f"{BUILTIN_PREFIX}tiny-qwen2"))


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentrl.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
