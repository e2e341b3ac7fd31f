"""OpenAI-style error objects, and the handlers that turn every failure into one.

Every error response has the shape OpenAI clients parse::

    {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class GatewayError(Exception):
    """A request the gateway answers with ``status`` and an OpenAI error object."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The JSON body of an error response."""
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(error: GatewayError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
    return JSONResponse(
        error_body(error.status, error.message, error.param, error.code),
        status_code=error.status,
        headers=headers,
    )


def _describe_validation(exc: RequestValidationError) -> tuple[str, str | None]:
    """A one-line message and the offending parameter for a validation failure."""
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(location) or None
    if first.get("type") == "json_invalid":
        return "request body is not valid JSON: " + str(first.get("msg", "")), None
    message = f"{param or 'body'}: {first.get('msg', 'invalid value')}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem(s))"
    return message, param


def install_error_handlers(app: FastAPI) -> None:
    """Map gateway errors, validation errors, HTTP errors and crashes to OpenAI errors."""

    @app.exception_handler(GatewayError)
    async def _gateway_error(_: Request, exc: GatewayError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _describe_validation(exc)
        return error_response(GatewayError(400, message, param=param, code="invalid_value"))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(GatewayError(exc.status_code, str(exc.detail)))

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("gateway: unhandled error on %s %s", request.method, request.url.path)
        return error_response(
            GatewayError(500, f"internal error ({type(exc).__name__}); see the gateway log")
        )
