"""Write the letter-counting recipe's data: reasoning-gym's ``letter_counting`` problems
as rows (``agentrl.envs.reasoning_gym``), split into train, dev and test with no question
in two splits, each prompt optionally led by worked examples (few-shot).

    python recipes/letter_counting/prepare_data.py --out-dir .cache/letter_counting \
        [--shots 3] [--train 2000] [--dev 128] [--test 256]

Writes ``train.jsonl``, ``dev.jsonl`` and ``test.jsonl``. The splits come from separate
generator seeds; a dev or test problem whose question a previous split holds is dropped
(a few words of text can repeat), so the held-out problems are unseen.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from agentrl import reasoning_gym_rows

TASK = "letter_counting"
# Short texts: a count of 1 to 3 in most problems, within a 135M model's reach.
CONFIG = {"min_words": 3, "max_words": 5}
SYSTEM_PROMPT = "direct"  # answer between <answer> tags, no reasoning
# reasoning-gym draws problem i of seed s from seed s + i: seeds far apart keep the splits
# from drawing the same problems.
SEEDS = {"train": 0, "dev": 100_000, "test": 200_000, "shots": 300_000}


def worked_examples(shots: int) -> list[dict[str, str]]:
    """``shots`` solved problems as user/assistant turns (from their own seed)."""
    messages: list[dict[str, str]] = []
    for row in reasoning_gym_rows(TASK, shots, seed=SEEDS["shots"], config=CONFIG):
        answer = row["reward_model"]["ground_truth"]
        messages += [
            row["prompt"][-1],
            {"role": "assistant", "content": f"<answer>{answer}</answer>"},
        ]
    return messages


def splits(sizes: dict[str, int], shots: int) -> dict[str, list[dict[str, Any]]]:
    """The rows of each split, with ``shots`` worked examples before each question."""
    examples = worked_examples(shots) if shots else []
    seen: set[str] = {message["content"] for message in examples if message["role"] == "user"}
    out: dict[str, list[dict[str, Any]]] = {}
    for split, size in sizes.items():
        rows = []
        for row in reasoning_gym_rows(
            TASK, size, seed=SEEDS[split], config=CONFIG, system_prompt=SYSTEM_PROMPT
        ):
            question = row["prompt"][-1]["content"]
            if split != "train" and question in seen:
                continue
            row["prompt"] = row["prompt"][:-1] + examples + row["prompt"][-1:]
            rows.append(row)
        seen |= {row["prompt"][-1]["content"] for row in rows}
        out[split] = rows
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--shots", type=int, default=3, help="worked examples per prompt")
    for split, default in (("train", 2000), ("dev", 128), ("test", 256)):
        parser.add_argument(f"--{split}", type=int, default=default, help=f"{split} problems")
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    sizes = {"train": args.train, "dev": args.dev, "test": args.test}
    for split, rows in splits(sizes, args.shots).items():
        path = args.out_dir / f"{split}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        print(f"{path}: {len(rows)} problems")


if __name__ == "__main__":
    main()
