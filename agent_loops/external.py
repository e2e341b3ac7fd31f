"""``external``: an agent written with any OpenAI-compatible client, trained unmodified.

For each dataset row the loop starts the user's agent (a Python function or a
subprocess) pointed at the gateway with a base URL that carries this episode's session
id (``{gateway}/sessions/{session_id}/v1``), waits for it, finishes the session, and
returns the samples the gateway recorded: the exact ids the engine produced plus the
template deltas of tool/user turns. The session is opened as *managed* first, so a
gateway whose sink feeds the trainer's queue (``gateway.sink: queue``) does not put the
same trajectory a second time.

    rollout:
      agent_name: external
      external: {entrypoint: my_agents.calc:run, gateway_url: http://127.0.0.1:8765}

    async def run(row, endpoint):          # my_agents/calc.py
        client = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key)
        ...
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import logging
import os
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from agentrl.agent_loops.base import AgentLoopBase
from agentrl.agent_loops.external_config import ExternalAgentConfig
from agentrl.agent_loops.registry import register_agent_loop
from agentrl.core.trajectory import AgentLoopOutput
from agentrl.core.types import SamplingParams

logger = logging.getLogger(__name__)

_NO_KEY = "EMPTY"  # OpenAI clients insist on some key even when the gateway needs none


class ExternalAgentError(RuntimeError):
    """The external agent failed, timed out, or made no model calls."""


@dataclass
class AgentEndpoint:
    """Where and how an external agent reaches the model for one episode."""

    base_url: str
    api_key: str
    session_id: str
    model: str
    sampling: dict[str, Any]


@register_agent_loop("external")
class ExternalAgentLoop(AgentLoopBase):
    """Runs a user's agent against the gateway and returns its recorded samples.

    Override ``score`` to compute rewards (the default uses a reward the agent posted to
    the gateway, or a number the agent returned).
    """

    async def run(self, sample: dict[str, Any], sampling: SamplingParams) -> list[AgentLoopOutput]:
        cfg = self._external_config()
        session_id = self.context.session_id
        root = cfg.gateway_url.rstrip("/")
        api_key = cfg.api_key or _NO_KEY
        headers = {"Authorization": f"Bearer {api_key}"}
        async with httpx.AsyncClient(base_url=root, headers=headers, timeout=60.0) as http:
            await _open_managed(http, session_id)
            endpoint = AgentEndpoint(
                base_url=f"{root}/sessions/{session_id}/v1",
                api_key=api_key,
                session_id=session_id,
                model=cfg.model or await _served_model(http),
                sampling=asdict(sampling),
            )
            try:
                result = await asyncio.wait_for(
                    self._start_agent(cfg, sample, endpoint), timeout=cfg.timeout_s
                )
            except TimeoutError:
                raise ExternalAgentError(
                    f"external agent timed out after {cfg.timeout_s:g} s (session {session_id})"
                ) from None
            finally:
                trajectory = await _finish(http, session_id)
        outputs = self._outputs(trajectory)
        if not outputs:
            raise ExternalAgentError(
                f"the external agent made no model calls through the gateway in session "
                f"{session_id} (did it use endpoint.base_url?)"
            )
        reward = await self.score(sample, outputs, result)
        if reward is not None:
            for output in outputs:
                output.reward = reward
        return outputs

    async def score(
        self, sample: dict[str, Any], outputs: list[AgentLoopOutput], agent_result: Any
    ) -> float | None:
        """The reward of this episode's samples; None keeps what the gateway recorded.

        Default: a number the agent returned, else None. Subclass to plug in a reward
        function (``sample`` is the dataset row with its ground truth).
        """
        if isinstance(agent_result, int | float) and not isinstance(agent_result, bool):
            return float(agent_result)
        return None

    def _external_config(self) -> ExternalAgentConfig:
        cfg = self.config.external
        if (cfg.entrypoint is None) == (cfg.command is None):
            raise ExternalAgentError(
                "rollout.external needs exactly one of `entrypoint` (pkg.module:function) "
                "or `command` (a subprocess command list)"
            )
        return cfg

    async def _start_agent(
        self, cfg: ExternalAgentConfig, sample: dict[str, Any], endpoint: AgentEndpoint
    ) -> Any:
        if cfg.entrypoint is not None:
            agent = _import(cfg.entrypoint)
            if inspect.iscoroutinefunction(agent):
                return await agent(sample, endpoint)
            return await asyncio.to_thread(agent, sample, endpoint)
        assert cfg.command is not None
        return await _run_command(cfg.command, sample, endpoint)

    def _outputs(self, trajectory: dict[str, Any]) -> list[AgentLoopOutput]:
        """The samples of the gateway's finished-session JSON, cut to the response limit."""
        session_metrics = trajectory.get("metrics", {})
        outputs = [AgentLoopOutput(**sample) for sample in trajectory.get("samples", [])]
        for output in outputs:
            output.metrics = {**session_metrics, **output.metrics}
            output.truncate(self.config.max_response_length)
        return outputs


def _import(path: str) -> Any:
    module_name, _, attr = path.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ExternalAgentError(f"cannot import external agent {path!r}: {exc}") from exc


_served_models: dict[str, str] = {}


async def _served_model(http: httpx.AsyncClient) -> str:
    """The gateway's model name (asked once per gateway)."""
    key = str(http.base_url)
    if key not in _served_models:
        response = await http.get("/v1/models")
        response.raise_for_status()
        _served_models[key] = response.json()["data"][0]["id"]
    return _served_models[key]


async def _open_managed(http: httpx.AsyncClient, session_id: str) -> None:
    """Open the session as *managed*: this loop returns its samples to the trainer, so
    the gateway's training sink (``gateway.sink: queue``) must not send them again."""
    response = await http.post(f"/v1/sessions/{session_id}", json={"managed": True})
    response.raise_for_status()


async def _finish(http: httpx.AsyncClient, session_id: str) -> dict[str, Any]:
    """Finish the session and return its recorded trajectory ({} if it has no calls)."""
    response = await http.post(f"/v1/sessions/{session_id}/finish")
    if response.status_code == 404:
        return {}
    response.raise_for_status()
    return response.json()


async def _run_command(command: list[str], sample: dict[str, Any], endpoint: AgentEndpoint) -> Any:
    """Run the agent as a subprocess; its last stdout line (if JSON) is its result."""
    row = json.dumps(sample, default=str)
    env = {
        **os.environ,
        "OPENAI_BASE_URL": endpoint.base_url,
        "OPENAI_API_KEY": endpoint.api_key,
        "AGENTRL_SESSION_ID": endpoint.session_id,
        "AGENTRL_MODEL": endpoint.model,
        "AGENTRL_ROW": row,
    }
    process = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        stdout, stderr = await process.communicate(row.encode())
    except asyncio.CancelledError:  # timeout or shutdown: do not leave the agent running
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise
    if process.returncode != 0:
        tail = stderr.decode(errors="replace").strip()[-2000:]
        raise ExternalAgentError(
            f"external agent {command[0]!r} exited with status {process.returncode}: {tail}"
        )
    lines = stdout.decode(errors="replace").strip().splitlines()
    if not lines:
        return None
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError:
        return None
