"""Environment defaults for a machine without a model hub: one cache root, offline
Hugging Face, vLLM's CPU threads bound automatically.

Imported before transformers, vLLM or Ray read their environment (they read some of it at
import time), so this module imports nothing heavy.
"""

from __future__ import annotations

import os
from pathlib import Path


def use_local_defaults(cache_root: Path) -> Path:
    """Set, where not set already, the variables the tests and benchmarks run under;
    returns the cache root in effect (``$AGENTRL_CACHE`` wins over ``cache_root``)."""
    root = Path(os.environ.setdefault("AGENTRL_CACHE", str(cache_root)))
    os.environ.setdefault("VLLM_CACHE_ROOT", str(root / "vllm"))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "auto")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return root
