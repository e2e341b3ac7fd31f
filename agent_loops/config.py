"""The ``rollout`` section: how agent loops run episodes (turns, tools, templates, workers).

Owned by the agent loops, which read it in every episode; :mod:`agentrl.config` mounts
:class:`RolloutConfig` as ``rollout``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agentrl.agent_loops.external_config import ExternalAgentConfig
from agentrl.core.config import Section
from agentrl.envs.config import EnvConfig


class RolloutConfig(Section):
    agent_name: str = Field(
        "single_turn",
        description="Agent loop for rows without an `agent_name`: a registered name or an "
        "import path `pkg.module:Class`.",
    )
    n: int = Field(1, ge=1, description="Samples (episodes) per dataset row (group size).")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling threshold.")
    top_k: int = Field(-1, description="Top-k sampling (-1 = off).")
    seed: int | None = Field(
        None,
        description="Base sampling seed; each episode derives its own from it (reproducible "
        "rollouts on engines that honour seeds: HFEngine, vLLM on GPU). None = unseeded.",
    )
    max_prompt_length: int = Field(1024, ge=1, description="Longest prompt in tokens.")
    max_response_length: int = Field(
        1024,
        ge=1,
        description="Token budget of one episode's response, over all turns (model + tool).",
    )
    max_assistant_turns: int = Field(8, ge=1, description="Most model turns per episode.")
    max_user_turns: int = Field(8, ge=0, description="Most tool/user turns appended per episode.")
    max_parallel_calls: int = Field(
        4, ge=1, description="Tool calls of one turn executed concurrently (extra calls wait)."
    )
    max_tool_response_length: int = Field(
        2048, ge=16, description="Characters of a tool response kept before truncation."
    )
    tool_response_truncate_side: Literal["left", "right", "middle"] = Field(
        "middle", description="Which part of an over-long tool response is cut."
    )
    tool_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Time limit of one tool call, counted from when the tool admits it "
        "(a code-interpreter call first waits for a free sandbox slot).",
    )
    tool_parser: str = Field(
        "hermes",
        description="Tool-call parser: `hermes` (built in, needs no vLLM), a name registered "
        "with `@register_tool_parser`, or any tool-call parser of the installed vLLM "
        "(`llama3_json`, `mistral`, `qwen3_coder`, `deepseek_v3`, ...; `vllm:hermes` for "
        "vLLM's own Hermes parser). docs/models.md lists what to set per model family.",
    )
    reasoning_parser: str | None = Field(
        None,
        description="Reasoning parser of the installed vLLM (`qwen3`, `deepseek_r1`, ...) "
        "for models that think before answering: tool calls are parsed from the text after "
        "the reasoning. Every sampled token, reasoning included, stays in the trajectory. "
        "None = the whole turn is content.",
    )
    tool_config_path: str | None = Field(
        None, description="YAML file listing the tools (class_name, config, tool_schema)."
    )
    tools_in_system_prompt: bool | None = Field(
        None,
        description="Describe tools in a system prompt instead of the template's `tools=`; "
        "None = only when the chat template ignores tools.",
    )
    tools_prompt_template: str | None = Field(
        None,
        description="With tools in the system prompt: its text, a format string whose "
        "`{tools}` is replaced by one JSON schema per line. None = Hermes-style instructions "
        "(the format Qwen2.5 templates use). Shorter prompts train faster on small models.",
    )
    drift_check_rate: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Fraction of episodes whose accumulated ids are compared with a full "
        "chat-template render (tokenization drift check).",
    )
    keep_messages: bool = Field(
        False,
        description="Keep each episode's conversation as chat messages in "
        "`output.extra['messages']` (for inspection). Off by default: the token ids already "
        "hold the conversation.",
    )
    template_cache: bool = Field(
        True,
        description="Render chat-template prompts and tool-response deltas from a per-shape "
        "cache (checked once per shape against the template); false renders every time. "
        "Turn off for templates that branch on message contents (the drift check flags them).",
    )
    num_workers: int = Field(2, ge=1, description="Agent-loop worker actors.")
    max_concurrent_loops: int = Field(
        256, ge=1, description="Agent loops running at once in one worker."
    )
    loop_timeout_s: float = Field(
        900.0, gt=0, description="Time limit of one episode; a timed-out episode fails."
    )
    worker_num_cpus: float = Field(0.0, ge=0, description="Ray CPUs per agent-loop worker.")
    worker_death_retries: int = Field(
        1,
        ge=0,
        description="Times an episode whose agent-loop worker died under it runs again (on "
        "another live worker or the restarted one) before it counts as failed. Nothing of it "
        "left the dead worker, so a rerun trains nothing twice; its tool calls do run again, "
        "so set 0 for tools whose side effects must not repeat.",
    )
    worker_restart_timeout_s: float = Field(
        300.0,
        gt=0,
        description="How long a dead agent-loop worker may take to come back (Ray restarts it "
        "up to 3 times); later episodes go to the live workers meanwhile, or wait. A worker "
        "not back in time is given up; with none left, episodes raise NoLiveWorker.",
    )
    external: ExternalAgentConfig = Field(default_factory=ExternalAgentConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
