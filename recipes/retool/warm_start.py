"""ReTool's cold start, CPU-sized: a short SFT on code-interpreter demonstrations.

ReTool fine-tunes on code-augmented reasoning traces before RL, so the policy already
knows the tool-call format and RL only has to learn *when* and *what* to run.
SmolLM2-135M never emits a well-formed Hermes tool call unprompted, so without this
stage the first RL steps see no tool use and almost no reward signal.

For each training row ``Calculate <expression>.`` the demonstration is::

    assistant: <tool_call>{"name": "code_interpreter",
                "arguments": {"code": "print(<expression>)"}}</tool_call>
    tool:      (what the real sandboxed interpreter printed)
    assistant: The answer is \\boxed{<ground truth>}.

tokenized exactly as the agent loop will see it (same chat template, tool prompt and
template deltas), with the loss on the assistant tokens only. With ``--direct-fraction``,
that share of the demonstrations answers at once, without the tool, so the policy starts
out using the tool only some of the time and RL can raise the rate. Writes a Hugging Face
checkpoint that ``model.path`` can point to, and skips the work when ``--out`` already
holds a warm start of the same demonstrations and settings.

    .venv/bin/python recipes/retool/warm_start.py --config recipes/retool/cpu.yaml \\
        --data .cache/retool/train.jsonl --out .cache/retool/warm-start
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import random
import re
import time
from pathlib import Path
from typing import Any

import torch
from rich.progress import Progress
from transformers import AutoModelForCausalLM

from agentrl.config import load_config
from agentrl.models import resolve_model_path
from agentrl.rollout.worker import AgentLoopWorker

logger = logging.getLogger("retool.warm_start")

_QUESTION = re.compile(r"^Calculate (.+?)\.?$")


def demo_messages(row: dict[str, Any]) -> tuple[list[dict[str, Any]], str] | None:
    """The prompt plus the assistant's tool call, and the code it runs (None: not a
    ``Calculate ...`` row)."""
    match = _QUESTION.match(row.get("extra_info", {}).get("question", "").strip())
    if match is None:
        return None
    code = f"print({match.group(1)})"
    call = json.dumps({"name": "code_interpreter", "arguments": {"code": code}})
    messages = [
        *row["prompt"],
        {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
    ]
    return messages, code


async def _tokenize(
    worker: AgentLoopWorker, row: dict[str, Any], direct: bool = False
) -> tuple[list[int], list[int]] | None:
    """(ids, loss mask) of one demonstration, built the way the agent loop builds it;
    ``direct``: the answer without a tool call."""
    demo = demo_messages(row)
    if demo is None:
        return None
    messages, code = demo
    renderer, eos = worker.renderer, worker.tokenizer.eos_token_id
    answer = row["reward_model"]["ground_truth"]
    final = [*renderer.encode_text(f"The answer is \\boxed{{{answer}}}."), eos]
    ids = await renderer.encode_prompt(row["prompt"])
    if direct:
        return ids + final, [0] * len(ids) + [1] * len(final)
    tool = worker.tools["code_interpreter"]
    instance = await tool.create()
    try:
        response, _, _ = await tool.execute(instance, {"code": code})
    finally:
        await tool.release(instance)
    mask = [0] * len(ids)
    call_ids = [*renderer.encode_text(messages[-1]["content"]), eos]
    ids += call_ids
    mask += [1] * len(call_ids)
    delta = await renderer.encode_delta([{"role": "tool", "content": response.text}], True)
    ids += delta
    mask += [0] * len(delta)
    ids += final
    mask += [1] * len(final)
    return ids, mask


def select_demonstrations(
    rows: list[dict[str, Any]], examples: int, direct_fraction: float
) -> list[tuple[dict[str, Any], bool]]:
    """``(row, direct)`` for each demonstration: the first ``examples`` ``Calculate ...``
    rows, of which the first ``round(examples * direct_fraction)`` answer directly."""
    chosen = [row for row in rows if demo_messages(row) is not None][:examples]
    direct = round(examples * direct_fraction)
    return [(row, index < direct) for index, row in enumerate(chosen)]


def _fingerprint(examples: list, settings: dict[str, Any]) -> str:
    """Identifies a warm start: the exact token ids and masks, and every setting."""
    digest = hashlib.sha256(json.dumps([examples, sorted(settings.items())]).encode())
    return digest.hexdigest()


def _batches(examples: list, batch_size: int, epochs: int, seed: int):
    rng = random.Random(seed)
    for _ in range(epochs):
        order = list(examples)
        rng.shuffle(order)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            yield order[start : start + batch_size]


def _loss(model, batch: list[tuple[list[int], list[int]]], pad_id: int) -> torch.Tensor:
    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad_id)
    labels = torch.full((len(batch), width), -100)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for i, (seq, mask) in enumerate(batch):
        ids[i, : len(seq)] = torch.tensor(seq)
        attention[i, : len(seq)] = 1
        labels[i, : len(seq)] = torch.tensor(
            [t if m else -100 for t, m in zip(seq, mask, strict=True)]
        )
    return model(input_ids=ids, attention_mask=attention, labels=labels).loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="recipes/retool/cpu.yaml")
    parser.add_argument(
        "--model", default="builtin:smollm2-135m-instruct", help="the model to start from"
    )
    parser.add_argument("--data", default=".cache/retool/train.jsonl")
    parser.add_argument("--out", default=".cache/retool/warm-start")
    parser.add_argument("--examples", type=int, default=16, help="demonstrations to train on")
    parser.add_argument(
        "--direct-fraction",
        type=float,
        default=0.0,
        help="share of the demonstrations that answer without calling the tool",
    )
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.manual_seed(args.seed)

    cfg = load_config(args.config)
    model_path = resolve_model_path(args.model)
    # The worker gives the exact renderer and tools the agent loops use; it never generates.
    worker = AgentLoopWorker(
        cfg.model_dump() | {"model": {**cfg.model.model_dump(), "path": model_path}},
        client=object(),
    )
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    random.Random(args.seed).shuffle(rows)

    async def build() -> list[tuple[list[int], list[int]]]:
        examples = []
        for row, direct in select_demonstrations(rows, args.examples, args.direct_fraction):
            examples.append(await _tokenize(worker, row, direct=direct))
        return examples

    examples = asyncio.run(build())
    out = Path(args.out)
    fingerprint = _fingerprint(examples, vars(args) | {"model_path": model_path})
    marker = out / "warm_start.json"
    if marker.exists() and json.loads(marker.read_text()).get("fingerprint") == fingerprint:
        logger.info("%s is up to date (same demonstrations and settings); skipping", out)
        return
    logger.info(
        "%d demonstrations (%.0f tokens each on average)",
        len(examples),
        sum(len(e[0]) for e in examples) / max(1, len(examples)),
    )
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    steps = args.epochs * (len(examples) // args.batch_size)
    start = time.perf_counter()
    with Progress() as progress:
        task = progress.add_task("warm start", total=steps)
        for step, batch in enumerate(_batches(examples, args.batch_size, args.epochs, args.seed)):
            loss = _loss(model, batch, worker.tokenizer.pad_token_id or 0)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            progress.update(task, advance=1, description=f"warm start: loss {loss.item():.3f}")
            logger.info("step %d/%d loss %.4f", step + 1, steps, loss.item())
    model.save_pretrained(out)
    worker.tokenizer.save_pretrained(out)
    marker.write_text(json.dumps({"fingerprint": fingerprint, "settings": vars(args)}, indent=2))
    logger.info("saved %s after %.0f s", out, time.perf_counter() - start)


if __name__ == "__main__":
    main()
