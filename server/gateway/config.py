"""``GatewayConfig``: the OpenAI-compatible HTTP gateway's section of the config tree."""

from __future__ import annotations

from pydantic import Field

from agentrl.core.config import Section


class GatewayConfig(Section):
    """Settings of the gateway (``gateway.*``).

    The gateway is served by Ray Serve's HTTP proxy, so it listens on
    ``server.http_host:server.http_port`` (127.0.0.1 by default) under ``route_prefix``.
    """

    enabled: bool = Field(
        False,
        description="Start the gateway in front of the rollout app, with `agentrl serve`, "
        "`train`, `eval` or `rollout` (external agents, `agent_name: external`, call it).",
    )
    app_name: str = Field("gateway", description="Ray Serve application name of the gateway.")
    route_prefix: str = Field(
        "/", pattern=r"^/", description="HTTP path the gateway is mounted at (e.g. `/` or `/rl`)."
    )
    served_model_name: str | None = Field(
        None,
        description="Model name `/v1/models` lists; None = the model's short name "
        "(`smollm2-135m-instruct` for `builtin:smollm2-135m-instruct`, `Model-1B` for "
        "`Org/Model-1B`, the last folder of a directory). Requests may send this name, the "
        "short name or `model.path` (as written or resolved); others get 404.",
    )
    api_key: str | None = Field(
        None,
        description="If set, every request needs `Authorization: Bearer <api_key>` (401 "
        "otherwise). None = no authentication: keep the gateway on 127.0.0.1 then.",
    )
    max_body_bytes: int = Field(
        4 * 1024**2, ge=1024, description="Largest request body accepted (413 beyond)."
    )
    default_max_tokens: int = Field(
        1024,
        ge=1,
        description="Completion length when a request gives no max_tokens (always capped by "
        "the context window left after the prompt).",
    )
    max_n: int = Field(8, ge=1, description="Largest `n` (choices per request) accepted.")
    tool_parser: str = Field(
        "hermes",
        description="Tool-call parser for `tool_calls` in replies: any name "
        "`rollout.tool_parser` takes (built in or the installed vLLM's). In a full config "
        "left unset it takes `rollout.tool_parser`, so the gateway parses as the loops do.",
    )
    reasoning_parser: str | None = Field(
        None,
        description="Reasoning parser of the installed vLLM (`qwen3`, `deepseek_r1`, ...): "
        "replies carry the model's reasoning as `reasoning_content` and tool calls are parsed "
        "after it. In a full config left unset it takes `rollout.reasoning_parser`.",
    )
    tools_in_system_prompt: bool | None = Field(
        None,
        description="A request's `tools` in a system prompt instead of the template's "
        "`tools=`; None = only when the chat template ignores tools. In a full config left "
        "unset it takes `rollout.tools_in_system_prompt`, so the gateway renders tools as "
        "the agent loops do.",
    )
    tools_prompt_template: str | None = Field(
        None,
        description="With tools in the system prompt: its text, a format string whose "
        "`{tools}` is replaced by one JSON schema per line; None = Hermes-style instructions. "
        "In a full config left unset it takes `rollout.tools_prompt_template`.",
    )
    session_ttl_s: float = Field(
        3600.0,
        gt=0,
        description="An unfinished session idle this long is finished (and sent to the sink); "
        "a finished session is forgotten this long after it finished.",
    )
    max_sessions: int = Field(
        10_000,
        ge=1,
        description="Sessions kept in memory. At the bound the oldest finished session is "
        "dropped; unfinished sessions are never dropped (new sessions get 429 instead).",
    )
    sink: str = Field(
        "memory",
        pattern=r"^(memory|queue(:[A-Za-z0-9._@/-]+)?|[A-Za-z_][\w.]*:[A-Za-z_]\w*)$",
        description="Where finished sessions go: `memory` (kept in the gateway, bounded by "
        "`sink_capacity`); `queue` or `queue:ACTOR_NAME`: to the training `TrajectoryQueue` "
        "Ray actor of that name (default `agentrl-trajectory-queue`, looked up in "
        "`ray.namespace` at the first finished session; `agentrl train` with the "
        "AsyncTrainer creates it under that name), so sessions of free-running clients are "
        "trained on like the agent loops' episodes (group them with the `x-group-id` "
        "header; sessions driven by ExternalAgentLoop are skipped, the loop returns them); "
        "or an import path `pkg.module:factory` returning a TrajectorySink.",
    )
    sink_capacity: int = Field(
        10_000,
        ge=1,
        description="Finished sessions the in-memory sink keeps (oldest dropped), and the "
        "queue sink holds in memory while the queue actor is unreachable (more are held on "
        "local disk, none dropped).",
    )
    request_timeout_s: float = Field(
        600.0, gt=0, description="Time limit of one generation; the request gets 504 beyond."
    )
    max_ongoing_requests: int = Field(
        1024, ge=1, description="Ray Serve max in-flight HTTP requests of the gateway replica."
    )
    num_cpus: float = Field(0.0, ge=0, description="Ray CPUs reserved for the gateway replica.")
    access_log: bool = Field(
        False,
        description="Ray Serve's access log of the gateway replica: one line per HTTP request "
        "(`POST /v1/chat/completions 200 60ms`), to the console and the Serve log files. Off "
        "by default: an agent framework sends thousands of requests per run.",
    )
