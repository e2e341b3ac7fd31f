"""A scripted multi-turn serving demo: what ``agentrl serve CONFIG --demo`` runs.

Concurrent chat sessions talk to the rollout servers token-in/token-out for several turns;
the table shows which replica served each session and how much of each growing prompt
came from the prefix cache. Then a weight update is broadcast with a new version, and a
request generated afterwards carries it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from agentrl.core.types import SamplingParams
from agentrl.server.client import DataClient, ServerClient
from agentrl.server.weight_transport.object_store import ObjectStoreSync

logger = logging.getLogger(__name__)

QUESTIONS = [
    "What is 12 + 30?",
    "Name three colours.",
    "Why is the sky blue?",
    "Write a haiku about rivers.",
    "What is the capital of France?",
    "Explain recursion in one sentence.",
    "How many legs does a spider have?",
    "What is 7 times 8?",
]
FOLLOW_UPS = ["Can you say more?", "Now explain it to a child.", "Summarise in five words."]


@dataclass
class SessionLog:
    """What one demo session saw."""

    session_id: str
    replicas: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    cacheable_tokens: int = 0
    cached_tokens: int = 0
    last_reply: str = ""


def _user_turn_ids(tokenizer, text: str, previous_ended: bool) -> list[int]:
    """Token ids that close the assistant turn (if cut off) and add a user turn."""
    closing = "\n" if previous_ended else "<|im_end|>\n"
    delta = f"{closing}<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    return tokenizer.encode(delta, add_special_tokens=False)


async def _run_session(
    client: DataClient, tokenizer, index: int, turns: int, sampling: SamplingParams
) -> SessionLog:
    log = SessionLog(session_id=f"demo-{index}")
    messages = [{"role": "user", "content": QUESTIONS[index % len(QUESTIONS)]}]
    prompt = await asyncio.to_thread(
        tokenizer.apply_chat_template,
        messages,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    previous_len = 0
    for turn in range(turns):
        out = await client.generate(log.session_id, prompt, sampling)
        log.replicas.append(out.replica_id)
        log.prompt_tokens += len(prompt)
        if turn > 0:
            log.cached_tokens += out.num_cached_tokens
            log.cacheable_tokens += previous_len
        log.last_reply = tokenizer.decode(out.token_ids, skip_special_tokens=True)
        ended = bool(out.token_ids) and out.token_ids[-1] == tokenizer.eos_token_id
        previous_len = len(prompt) + len(out.token_ids)
        follow_up = FOLLOW_UPS[turn % len(FOLLOW_UPS)]
        prompt = prompt + out.token_ids + _user_turn_ids(tokenizer, follow_up, ended)
    return log


async def run_serving_demo(
    client: ServerClient,
    tokenizer,
    model_path: str,
    *,
    num_sessions: int = 8,
    turns: int = 3,
    max_tokens: int = 48,
) -> list[SessionLog]:
    """Run the demo sessions concurrently, print the tables, return the session logs.

    Closes ``client`` (its data path routes on this event loop, which ends with the demo)."""
    async with client:
        return await _run_demo(client, tokenizer, model_path, num_sessions, turns, max_tokens)


async def _run_demo(
    client: ServerClient,
    tokenizer,
    model_path: str,
    num_sessions: int,
    turns: int,
    max_tokens: int,
) -> list[SessionLog]:
    console = Console()
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.7, top_p=0.95)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("multi-turn sessions", total=num_sessions)

        async def tracked(i: int) -> SessionLog:
            log = await _run_session(client.data, tokenizer, i, turns, sampling)
            progress.advance(task)
            return log

        logs = await asyncio.gather(*(tracked(i) for i in range(num_sessions)))
    console.print(_session_table(logs))

    replicas = await client.control.stats()
    new_version = max(r["weight_version"] for r in replicas) + 1
    console.print(f"Broadcasting a weight update as version {new_version} to every replica...")
    weights = await asyncio.to_thread(_checkpoint_weights, model_path)
    await ObjectStoreSync(client.control).push(weights, new_version)
    check = await client.data.generate("demo-after-update", [tokenizer.eos_token_id], sampling)
    console.print(
        f"versions after update: {sorted({v for v in check.token_versions})} "
        f"(replicas: {sorted(r['weight_version'] for r in await client.control.stats())})"
    )
    return logs


def _checkpoint_weights(model_path: str):
    """The checkpoint's weights (the demo re-sends them; a trainer would send new ones)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    return list(model.state_dict().items())


def _session_table(logs: list[SessionLog]) -> Table:
    table = Table(title="Multi-turn sessions (token in, token out)")
    for column in ("session", "replicas per turn", "prompt tok", "cached / cacheable", "reply"):
        table.add_column(column)
    for log in logs:
        hit = f"{log.cached_tokens}/{log.cacheable_tokens}"
        short = [r[-6:] for r in log.replicas]
        table.add_row(
            log.session_id, " ".join(short), str(log.prompt_tokens), hit, log.last_reply[:40]
        )
    cached = sum(log.cached_tokens for log in logs)
    cacheable = sum(log.cacheable_tokens for log in logs) or 1
    table.caption = f"prefix-cache hit ratio on cacheable tokens: {cached / cacheable:.2f}"
    return table
