"""Dataset rows for environment episodes, and the command that writes them as JSONL.

    python -m agentrl.envs.rows SOURCE --seeds 0:100 --out train.jsonl [--kwargs JSON]

``reasoning_gym:NAME`` sources give the dataset's problems (``reasoning_gym_rows``: the
first seed draws them all), scored by ``agentrl.envs.reasoning_gym``. Any other source
gives one row per seed (``env_rows``): ``agent_name: env``, the environment's opening
messages as the prompt, and ``extra_info.env_source`` / ``env_seed`` (/ ``env_kwargs``),
so each row replays its own episode start; score them with ``agentrl.envs.reward``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from agentrl.envs.registry import env_factory
from agentrl.envs.runner import EnvRunner

ENV_AGENT_NAME = "env"


def data_source_of(source: str) -> str:
    """The rows' ``data_source`` for an environment source (``gymnasium/FrozenLake-v1``)."""
    return source.replace(":", "/")


async def _opening(source: str, kwargs: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    runner = EnvRunner(env_factory(source)(**kwargs), source, timeout_s=60.0)
    try:
        messages, _ = await runner.reset(None, seed)
    finally:
        await runner.close()
    return messages


def env_rows(
    source: str, seeds: list[int], kwargs: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """One row per seed of ``source``: the prompt is the environment's opening for that
    seed (what the model sees first when the ``env`` loop runs the row)."""
    kwargs = dict(kwargs or {})

    async def build() -> list[dict[str, Any]]:
        rows = []
        for seed in seeds:
            extra_info: dict[str, Any] = {"env_source": source, "env_seed": seed}
            if kwargs:
                extra_info["env_kwargs"] = kwargs
            rows.append(
                {
                    "prompt": await _opening(source, kwargs, seed),
                    "data_source": data_source_of(source),
                    "reward_model": {"ground_truth": None, "style": "env"},
                    "extra_info": extra_info,
                    "agent_name": ENV_AGENT_NAME,
                }
            )
        return rows

    return asyncio.run(build())


def rows_for(
    source: str, seeds: list[int], kwargs: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """``reasoning_gym_rows`` for ``reasoning_gym:`` sources (``len(seeds)`` problems
    from the first seed, ``kwargs`` as its ``config`` and ``system_prompt``), ``env_rows``
    otherwise."""
    prefix, _, name = source.partition(":")
    if prefix == "reasoning_gym":
        env_factory(source)  # an unknown name fails here, listing the close ones
        from agentrl.envs.reasoning_gym import reasoning_gym_rows

        start = seeds[0] if seeds else 0
        return reasoning_gym_rows(name, len(seeds), seed=start, **(kwargs or {}))
    return env_rows(source, seeds, kwargs)


def parse_seeds(text: str) -> list[int]:
    """``"0:100"`` (a range, end excluded) or ``"1,5,9"``."""
    if ":" in text:
        start, _, stop = text.partition(":")
        return list(range(int(start), int(stop)))
    return [int(part) for part in text.split(",") if part.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m agentrl.envs.rows",
        description="Write dataset rows (JSONL) for an environment source.",
    )
    parser.add_argument("source", help="reasoning_gym:NAME, gymnasium:ID, textarena:ID, ...")
    parser.add_argument("--seeds", default="0:100", help="A:B (B excluded) or a,b,c")
    parser.add_argument("--out", required=True, type=Path, help="the JSONL file to write")
    parser.add_argument(
        "--kwargs", default="{}", type=json.loads, help="the environment's kwargs, as JSON"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Write the rows; return how many."""
    args = build_parser().parse_args(argv)
    rows = rows_for(args.source, parse_seeds(args.seeds), args.kwargs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(f"wrote {len(rows)} rows to {args.out}")
    return len(rows)


if __name__ == "__main__":
    main()
