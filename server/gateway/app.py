"""The gateway's FastAPI application: routes, authentication and the body-size limit.

Every route exists twice: ``/v1/...`` (session from the ``x-session-id`` header) and
``/sessions/{session_id}/v1/...`` for clients that can only set a base URL. An
``x-group-id`` header puts the call's session in a group (one GRPO group in training).
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Header
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentrl.server.gateway.errors import GatewayError, error_body, install_error_handlers
from agentrl.server.gateway.protocol import (
    SESSION_ID_PATTERN,
    ChatCompletionRequest,
    CompletionRequest,
    FinishRequest,
    GenerateRequest,
    RewardRequest,
    SessionRequest,
)
from agentrl.server.gateway.responses import (
    ChatChunks,
    CompletionChunks,
    chat_completion,
    completion,
    generation,
    stream_events,
)
from agentrl.server.gateway.service import GatewayService

_SESSION_ID = re.compile(SESSION_ID_PATTERN)


async def _send_error(send: Send, status: int, message: str) -> None:
    body = json.dumps(error_body(status, message)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class AuthMiddleware:
    """Requires ``Authorization: Bearer <api_key>`` on every request (401 otherwise)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(given, self._expected):
                await _send_error(send, 401, "missing or wrong API key (Authorization: Bearer)")
                return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Reads the request body up front and refuses it (413) beyond ``max_bytes``."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self._max = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self._max):
            status = 413 if declared.isdigit() else 400
            await _send_error(send, status, f"request body over {self._max} bytes or malformed")
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._max:
                await _send_error(send, 413, f"request body over {self._max} bytes")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # lets streaming responses notice a disconnect
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def _session_id(path_id: str | None, header_id: str | None) -> str | None:
    if path_id is not None and header_id is not None and path_id != header_id:
        raise GatewayError(
            400, f"session id in the path ({path_id!r}) and x-session-id ({header_id!r}) differ"
        )
    session_id = path_id if path_id is not None else header_id
    if session_id is not None and not _SESSION_ID.fullmatch(session_id):
        raise GatewayError(
            400,
            f"session id {session_id[:140]!r} must match {SESSION_ID_PATTERN}",
            param="session_id",
        )
    return session_id


def _group_id(header_id: str | None) -> str | None:
    if header_id is not None and not _SESSION_ID.fullmatch(header_id):
        raise GatewayError(
            400, f"x-group-id {header_id[:140]!r} must match {SESSION_ID_PATTERN}", param="group_id"
        )
    return header_id


def _routes(app: FastAPI, path: str, endpoint: Callable[..., Any], method: str) -> None:
    """Register ``endpoint`` at ``path`` and at its session-prefixed twin."""
    for prefix in ("", "/sessions/{session_id}"):
        app.add_api_route(prefix + path, endpoint, methods=[method])


def build_app(service: GatewayService) -> FastAPI:
    """The gateway's ASGI app over ``service`` (wrapped in auth and body-limit middleware)."""
    config = service.config
    app = FastAPI(title="agentrl gateway", docs_url=None, redoc_url=None)
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes)
    if config.api_key:
        app.add_middleware(AuthMiddleware, api_key=config.api_key)
    started = int(time.time())

    def model_card() -> dict[str, Any]:
        return {
            "id": service.model_name,
            "object": "model",
            "created": started,
            "owned_by": "agentrl",
            "max_model_len": service.max_model_len,
        }

    async def list_models(session_id: str | None = None) -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    async def get_model(model: str, session_id: str | None = None) -> dict[str, Any]:
        service.check_model(model)
        return model_card()

    async def chat_completions(
        request: ChatCompletionRequest,
        session_id: str | None = None,
        x_session_id: str | None = Header(None),
        x_group_id: str | None = Header(None),
    ) -> Any:
        sid = _session_id(session_id, x_session_id)
        prepared = await service.prepare_chat(request, sid, _group_id(x_group_id))
        if request.stream:
            chunks = ChatChunks(service.tokenizer, request.logprobs)
            usage = bool(request.stream_options and request.stream_options.include_usage)
            events = stream_events(prepared, lambda: service.run(prepared), chunks, usage)
            return StreamingResponse(events, media_type="text/event-stream")
        result = await service.run(prepared)
        return JSONResponse(chat_completion(result, service.tokenizer, request.logprobs))

    async def completions(
        request: CompletionRequest,
        session_id: str | None = None,
        x_session_id: str | None = Header(None),
        x_group_id: str | None = Header(None),
    ) -> Any:
        sid = _session_id(session_id, x_session_id)
        prepared = await service.prepare_completion(request, sid, _group_id(x_group_id))
        if request.stream:
            usage = bool(request.stream_options and request.stream_options.include_usage)
            events = stream_events(
                prepared, lambda: service.run(prepared), CompletionChunks(), usage
            )
            return StreamingResponse(events, media_type="text/event-stream")
        result = await service.run(prepared)
        return JSONResponse(completion(result, service.tokenizer, request.logprobs))

    async def generate(
        request: GenerateRequest,
        session_id: str | None = None,
        x_session_id: str | None = Header(None),
        x_group_id: str | None = Header(None),
    ) -> JSONResponse:
        sid = _session_id(session_id, x_session_id)
        call_id, out = await service.generate_tokens(request, sid, _group_id(x_group_id))
        return JSONResponse(generation(call_id, out))

    _routes(app, "/v1/models", list_models, "GET")
    _routes(app, "/v1/models/{model}", get_model, "GET")
    _routes(app, "/v1/chat/completions", chat_completions, "POST")
    _routes(app, "/v1/completions", completions, "POST")
    _routes(app, "/v1/generate", generate, "POST")

    @app.post("/v1/sessions/{session_id}")
    async def open_session(session_id: str, request: SessionRequest | None = None) -> JSONResponse:
        """Open a session before its first call (idempotent): its group, and whether
        ``ExternalAgentLoop`` drives it (then training sinks skip it)."""
        sid = _session_id(session_id, None)
        options = request or SessionRequest()
        session = await service.store.open(sid, options.group_id, options.managed)
        return JSONResponse(session.to_json())

    @app.get("/v1/sessions/{session_id}")
    async def get_session(session_id: str) -> JSONResponse:
        """The recorded trajectory (each sample's ``AgentLoopOutput`` fields) and metrics."""
        await service.store.sweep()
        return JSONResponse(service.store.get(session_id).to_json())

    @app.post("/v1/sessions/{session_id}/reward")
    async def set_reward(session_id: str, request: RewardRequest) -> JSONResponse:
        """Set the session reward and/or per-call rewards (before finishing)."""
        session = service.store.set_rewards(session_id, request.reward, request.rewards)
        return JSONResponse(
            {
                "session_id": session_id,
                "reward": session.reward,
                "call_rewards": session.call_rewards,
            }
        )

    @app.post("/v1/sessions/{session_id}/finish")
    async def finish(session_id: str, request: FinishRequest | None = None) -> JSONResponse:
        """Finish the session (idempotent): its samples go to the sink; returns them."""
        options = request or FinishRequest()
        session = await service.store.finish(session_id, options.reward, group_id=options.group_id)
        return JSONResponse(session.to_json())

    return app
