"""``openenv:...``: an OpenEnv environment server, driven through openenv-core's client.

Two forms of source:

- ``openenv:http://HOST:PORT`` (or ``ws://``, ``https://``): a server that is already
  running;
- ``openenv:pkg.module:app``: the FastAPI app of an OpenEnv environment (what
  ``openenv.core.create_app`` returns, the ``server.app:app`` of an OpenEnv project).
  agentrl starts it with uvicorn on a free local port the first time a process needs it,
  shares it between that process's episodes, and stops it when the process exits.

Each episode is one session of openenv-core's ``GenericEnvClient`` (a WebSocket):
``reset`` → the first observation, each model turn → one ``step`` → the observation, the
reward and ``done``; when the episode ends, ``state()`` goes into the step's info. The
server must allow as many concurrent sessions as the worker runs episodes
(``create_app(..., max_concurrent_envs=N)`` on an environment with
``SUPPORTS_CONCURRENT_SESSIONS = True``).

The model's turn becomes the action through ``action`` (default: the turn's text in the
action's one string field, read from the server's ``/schema``), and an observation
becomes the user message through ``render`` (default: its one string field, else its
fields as JSON). Both are replaceable: callables or import paths ``pkg.module:name``.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
from openenv.core import GenericEnvClient

from agentrl.envs.base import EnvError, Message, StepResult
from agentrl.envs.registry import UnknownEnvError, import_callable

logger = logging.getLogger(__name__)

URL_SCHEMES = ("http://", "https://", "ws://", "wss://")
START_TIMEOUT_S = 60.0
"""How long a local server may take to answer ``/health`` after it starts."""

ActionFn = Callable[[Message], dict[str, Any]]
RenderFn = Callable[[dict[str, Any]], str]


def available_ids() -> list[str]:
    """The forms an OpenEnv source takes (its ids are open-ended)."""
    return ["http://HOST:PORT", "pkg.module:app"]


def check_id(env_id: str) -> None:
    """Raise ``UnknownEnvError`` for an id that is neither a URL nor an importable app."""
    if env_id.startswith(URL_SCHEMES):
        return
    module, sep, attr = env_id.partition(":")
    if sep and module and attr:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if found:
            return
        raise UnknownEnvError(
            f"unknown openenv app {env_id!r}: module {module!r} does not import; an "
            f"OpenEnv source is one of: {', '.join(available_ids())}"
        )
    raise UnknownEnvError(
        f"unknown openenv source {env_id!r}; an OpenEnv source is one of: "
        f"{', '.join(available_ids())}"
    )


def make(env_id: str, **kwargs: Any) -> OpenEnvEnv:
    """The factory behind ``openenv:ID`` (``kwargs``: see ``OpenEnvEnv``)."""
    return OpenEnvEnv(env_id, **kwargs)


class LocalServer:
    """An OpenEnv app served by uvicorn in a child process on ``127.0.0.1``.

    The child gets this process's ``sys.path`` as its ``PYTHONPATH``, so an app in a
    user module on the path imports there too. ``stop()`` ends it.
    """

    def __init__(self, app: str, port: int | None = None) -> None:
        self.app = app
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        command = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1"]
        command += ["--port", str(self.port), "--log-level", "warning"]
        self.process = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                stderr = (self.process.stderr.read() if self.process.stderr else "")[-2000:]
                raise EnvError(
                    f"openenv:{self.app}: the server exited with {self.process.returncode} "
                    f"before it was ready:\n{stderr}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise EnvError(
            f"openenv:{self.app}: no answer on {self.url}/health in {START_TIMEOUT_S:g} s"
        )

    def stop(self) -> None:
        """End the server process (and wait for it)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_SERVERS: dict[str, LocalServer] = {}
_SERVERS_LOCK = threading.Lock()


def shared_server(app: str) -> LocalServer:
    """This process's server of ``app``, started on first use."""
    with _SERVERS_LOCK:
        server = _SERVERS.get(app)
        if server is None or server.process.poll() is not None:
            server = _SERVERS[app] = LocalServer(app)
        return server


@atexit.register
def stop_servers() -> None:
    """Stop every server ``shared_server`` started."""
    with _SERVERS_LOCK:
        for server in _SERVERS.values():
            server.stop()
        _SERVERS.clear()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class OpenEnvEnv:
    """One OpenEnv session per episode (a ``TextEnv``).

    ``action``: ``fn(message) -> dict``, the action payload of the model's turn (the
    assistant message, with its ``tool_calls``); default: the turn's text in the action's
    one string field. ``render``: ``fn(observation) -> str``, the user message of an
    observation dict; default: its one string field, else its fields as JSON.
    ``reset_kwargs``: extra arguments of the server's ``reset``. ``message_timeout_s``:
    the client's limit on one answer (the loop's ``step_timeout_s`` applies as well).
    """

    def __init__(
        self,
        env_id: str,
        *,
        action: str | ActionFn | None = None,
        render: str | RenderFn | None = None,
        reset_kwargs: dict[str, Any] | None = None,
        message_timeout_s: float = 60.0,
    ) -> None:
        self.env_id = env_id
        self.name = f"openenv:{env_id}"
        self.to_action = import_callable(action, "openenv action") if action else None
        self.render = import_callable(render, "openenv render") if render else render_observation
        self.reset_kwargs = dict(reset_kwargs or {})
        self.message_timeout_s = message_timeout_s
        self.client: GenericEnvClient | None = None
        self.url = ""

    async def reset(
        self, row: dict[str, Any] | None = None, seed: int | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Open a session and reset it (``seed`` passed on when given)."""
        if self.env_id.startswith(URL_SCHEMES):
            self.url = self.env_id
        else:
            self.url = shared_server(self.env_id).url
        if self.to_action is None:
            self.to_action = _text_action(_action_text_field(self.url, self.name))
        self.client = GenericEnvClient(base_url=self.url, message_timeout_s=self.message_timeout_s)
        kwargs = dict(self.reset_kwargs)
        if seed is not None:
            kwargs["seed"] = seed
        result = await self.client.reset(**kwargs)
        observation = _observation(result.observation, self.name)
        return [{"role": "user", "content": self.render(observation)}], {"observation": observation}

    async def step(self, message: Message) -> StepResult:
        """The model's turn as one action; the episode ends when the server says done."""
        if self.client is None or self.to_action is None:
            raise EnvError(f"{self.name}: step before reset")
        result = await self.client.step(self.to_action(message))
        observation = _observation(result.observation, self.name)
        info: dict[str, Any] = {"observation": observation}
        done = result.done
        if done is True:
            info["state"] = await self.client.state()
        reward = result.reward
        if reward is None:
            reward = 0.0
        elif isinstance(reward, bool):  # OpenEnv's observations allow a bool reward
            reward = float(reward)
        return StepResult(
            [{"role": "user", "content": self.render(observation)}],
            reward,
            terminated=done,
            info=info,
        )

    async def close(self) -> None:
        """End the session."""
        if self.client is not None:
            await self.client.close()
            self.client = None


def render_observation(observation: dict[str, Any]) -> str:
    """An observation as text: its one string field, else all its fields as JSON."""
    texts = [v for v in observation.values() if isinstance(v, str)]
    if len(texts) == 1:
        return texts[0]
    return json.dumps(observation, sort_keys=True, default=str)


def _observation(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise EnvError(
            f"{name} returned an observation of type {type(value).__name__}, not an object"
        )
    return value


_ACTION_FIELDS: dict[str, str] = {}


def _action_text_field(url: str, name: str) -> str:
    """The action's one string field, from the server's ``/schema`` (cached per server)."""
    if url in _ACTION_FIELDS:
        return _ACTION_FIELDS[url]
    http_url = url.replace("ws://", "http://", 1).replace("wss://", "https://", 1)
    try:
        response = httpx.get(f"{http_url.rstrip('/')}/schema", timeout=10.0)
        response.raise_for_status()
        schema = response.json()["action"]
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        raise EnvError(
            f"{name}: cannot read the action schema at {http_url}/schema: {exc}"
        ) from exc
    properties = schema.get("properties", {})
    texts = [
        field
        for field, spec in properties.items()
        if field != "metadata" and spec.get("type") == "string"
    ]
    if len(texts) != 1:
        raise EnvError(
            f"{name}: the action has fields {sorted(properties)}, not one string field the "
            "model's text can fill; give rollout.env.kwargs.action (fn(message) -> action dict)"
        )
    _ACTION_FIELDS[url] = texts[0]
    return texts[0]


def _text_action(field: str) -> ActionFn:
    def action(message: Message) -> dict[str, Any]:
        return {field: message.get("content") or ""}

    return action
