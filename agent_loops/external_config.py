"""``ExternalAgentConfig``: how the ``external`` agent loop starts a user's agent.

Kept free of agent-loop imports so the ``rollout`` section (``agentrl.agent_loops.config``)
can hold it as ``rollout.external`` without loading the loops.
"""

from __future__ import annotations

from pydantic import Field

from agentrl.core.config import Section


class ExternalAgentConfig(Section):
    """Settings of ``ExternalAgentLoop`` (``rollout.external.*``)."""

    entrypoint: str | None = Field(
        None,
        description="Import path `pkg.module:function` of the agent (set this or `command`): "
        "called as `agent(row, endpoint)` (async or sync) with an `AgentEndpoint` (base_url, "
        "api_key, session_id, model, sampling).",
    )
    command: list[str] | None = Field(
        None,
        description="Subprocess command of the agent (instead of `entrypoint`). It gets the "
        "row as JSON on stdin and in AGENTRL_ROW, and OPENAI_BASE_URL, OPENAI_API_KEY, "
        "AGENTRL_SESSION_ID, AGENTRL_MODEL in its environment; exit status 0 = success; "
        "the last stdout line, if JSON, is the agent's result.",
    )
    gateway_url: str = Field(
        "http://127.0.0.1:8765",
        description="Root URL of the gateway (server.http_host:http_port plus "
        "gateway.route_prefix), without /v1.",
    )
    api_key: str | None = Field(None, description="The gateway's API key (gateway.api_key).")
    model: str | None = Field(
        None, description="Model name the agent should send; None = the gateway's model."
    )
    timeout_s: float = Field(
        600.0, gt=0, description="Time limit of one agent run; the agent is stopped beyond."
    )
