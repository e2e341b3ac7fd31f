"""Render trajectories as text for inspection: model spans as-is, tool/user spans marked."""

from __future__ import annotations

from itertools import groupby
from pathlib import Path
from typing import Any

from agentrl.trainer.batch import Sample

ENV_OPEN, ENV_CLOSE = "⟦", "⟧"


def render_sample(sample: Sample, tokenizer: Any) -> str:
    """The prompt, then the response with non-model tokens wrapped in ⟦ ⟧."""
    out = sample.output
    parts = [tokenizer.decode(out.prompt_ids)]
    position = 0
    for is_model, span in groupby(out.response_mask):
        length = len(list(span))
        text = tokenizer.decode(out.response_ids[position : position + length])
        parts.append(text if is_model else f"{ENV_OPEN}{text}{ENV_CLOSE}")
        position += length
    return "".join(parts)


def write_samples(path: Path, samples: list[Sample], tokenizer: Any) -> None:
    """Write ``samples`` to ``path`` with their scores and group ids."""
    path.parent.mkdir(parents=True, exist_ok=True)
    blocks = [
        f"### group {s.group_id}  score {s.score:.3f}  turns {s.output.num_turns}\n"
        f"{render_sample(s, tokenizer)}\n"
        for s in samples
    ]
    path.write_text("\n".join(blocks))
