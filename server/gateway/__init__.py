"""OpenAI-compatible HTTP gateway: external agents' calls become token-exact training data.

    url = start_gateway(cfg.gateway, cfg.model, cfg.server)   # after start_rollout_servers
    client = openai.OpenAI(base_url=url, api_key="...", default_headers={"x-session-id": sid})

The FastAPI app (``app``) serves ``/v1/models``, ``/v1/chat/completions``,
``/v1/completions``, ``/v1/generate`` and the session endpoints; ``service`` does the work;
``sessions`` records each session's calls and links them into samples; ``sink`` receives
finished sessions.
"""

from agentrl.server.gateway.config import GatewayConfig

__all__ = ["GatewayConfig"]
