"""Render trajectories as text for inspection: model spans as-is, tool/user spans marked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl.trainer.batch import Sample

ENV_OPEN, ENV_CLOSE = "⟦", "⟧"


def render_sample(sample: Sample, tokenizer: Any) -> str:
    """The prompt, then the response with non-model tokens wrapped in ⟦ ⟧."""
    out = sample.output
    parts = [tokenizer.decode(out.prompt_ids)]

    def add_env(start: int, end: int) -> None:
        if end > start:
            parts.append(f"{ENV_OPEN}{tokenizer.decode(out.response_ids[start:end])}{ENV_CLOSE}")

    position = 0
    for start, end in out.model_spans:
        add_env(position, start)
        parts.append(tokenizer.decode(out.response_ids[start:end]))
        position = end
    add_env(position, len(out.response_ids))
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
