"""The ``rollout.env`` section: which text environment the ``env`` agent loop runs, and how.

A leaf module (pydantic and the config base only): :mod:`agentrl.agent_loops.config`
mounts :class:`EnvConfig` as ``rollout.env``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from agentrl.core.config import Section


class EnvConfig(Section):
    """The environment of ``agent_name: env`` episodes (``EnvAgentLoop``)."""

    source: str | None = Field(
        None,
        description="The environment: `reasoning_gym:NAME`, `gymnasium:ID`, `textarena:ID`, "
        "`verifiers:TASKSET`, `openenv:URL` or `openenv:pkg.module:app`, a name registered "
        "with `@register_env`, or `pkg.module:factory` (a callable "
        "returning a TextEnv). A row's `extra_info.env_source` overrides it. None: every "
        "row names its own.",
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments of the environment's factory (docs/environments.md "
        "lists each adapter's); a row's `extra_info.env_kwargs` is merged over them.",
    )
    max_turns: int = Field(
        16,
        ge=1,
        description="Most model turns (environment steps) per episode; an episode that "
        "reaches it ends truncated (`stop_reason: max_turns`).",
    )
    step_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Time limit of one reset, step or close call; an environment past it "
        "fails the episode (a recorded failure, never a stuck worker).",
    )
    reward_aggregate: Literal["sum", "last", "mean"] = Field(
        "sum",
        description="The episode's reward from its per-turn rewards: their `sum`, the "
        "`last` one, or their `mean`. The per-turn rewards stay on the trajectory "
        "(`extra['turn_rewards']`).",
    )
    sync_in_thread: bool = Field(
        True,
        description="Run environments with plain (non-async) methods, the package adapters "
        "among them, in a thread, so that a hung step times out instead of blocking the "
        "worker; false runs them on the worker's event loop (faster for microsecond "
        "steps, but a hang there stalls every episode of the worker).",
    )
    self_play_trained: Literal["player", "both"] = Field(
        "player",
        description="With an environment whose other seats the policy itself plays "
        "(TextArena's `opponent: self`): train the model's player's turns only (`player`), "
        "or every seat's (`both`: one trajectory per seat, each with its seat's reward).",
    )
