"""What the learning benches (``bench/retool_vs_cold_start.py``, ``bench/env_recipe.py``)
share: accuracy with a problem's answers as one cluster, a gain and its standard error,
the digest of the weights an evaluation evaluated, and a trained checkpoint exported to
Hugging Face format for ``agentrl rollout``.
"""

from __future__ import annotations

import hashlib
import math
import statistics
import tempfile
from pathlib import Path
from typing import Any

from agentrl.testing.spread import mean_sd_se


def clustered_mean(values_by_problem: dict[int, list[float]]) -> tuple[float, float]:
    """The mean over problems of each problem's mean, and its standard error across
    problems (a problem's samples are one cluster)."""
    stats = mean_sd_se([statistics.fmean(values) for values in values_by_problem.values()])
    return stats["mean"], stats["se"]


def gain(after: dict[str, Any], before: dict[str, Any], key: str = "accuracy") -> dict:
    """``after − before`` and its standard error (independent evaluations)."""
    difference = after[key] - before[key]
    se = math.hypot(after[f"{key}_se"], before[f"{key}_se"])
    return {"gain": difference, "se": se, "in_se": difference / se if se else math.inf}


def sha256(files: list[Path]) -> str:
    """SHA-256 over ``files``' bytes, in order."""
    digest = hashlib.sha256()
    for path in files:
        with path.open("rb") as content:
            for block in iter(lambda: content.read(1 << 24), b""):
                digest.update(block)
    return digest.hexdigest()


def weights_sha256(model: Path) -> str:
    """SHA-256 over a Hugging Face folder's weight files (what an evaluation evaluated)."""
    files = sorted(model.glob("*.safetensors"))
    if not files:
        raise SystemExit(f"{model}: no *.safetensors weights")
    return sha256(files)


def export_checkpoint(checkpoint: Path, base: Path | str, out: Path) -> None:
    """Write a trained checkpoint's weights in Hugging Face format (config and tokenizer
    from ``base``, the model it started from)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    # save_pretrained's one-shard tqdm bar would cut through the benches' rich progress.
    transformers_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        flat = Path(tmp) / "state.pt"
        dcp_to_torch_save(checkpoint / "model_optim", flat)
        state = torch.load(flat, weights_only=False)["model"]
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied embeddings: the checkpoint may hold lm_head.weight or not; nothing else may differ.
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise SystemExit(f"{checkpoint}: missing {missing}, unexpected {unexpected}")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)


def rollout_command(
    agentrl: Path, config: Path, split: Path, model: str | Path, out: Path, *overrides: str
) -> list[str]:
    """``agentrl rollout`` of ``model`` over the problems in ``split`` (as the validation
    split of ``config``), the episodes written to ``out``."""
    return [
        str(agentrl),
        "rollout",
        str(config),
        "--split",
        "val",
        "--out",
        str(out),
        f"data.val_files=[{split}]",
        f"model.path={model}",
        *overrides,
    ]
