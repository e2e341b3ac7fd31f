"""``code_interpreter``: runs the model's Python code in a sandbox (ReTool style).

Every call starts a fresh interpreter (no state carries over between calls);
the value of a trailing expression is printed, as in a notebook cell. The model
reads stdout, then stderr, then a bracketed note if the run was cut short.
"""

from __future__ import annotations

import contextlib
from typing import Any

from pydantic import Field

from agentrl.tools.base import BaseTool, ToolResponse
from agentrl.tools.isolation import Isolation
from agentrl.tools.sandbox import (
    Sandbox,
    SandboxLimits,
    SandboxResult,
    sandbox_slot,
    set_max_concurrency,
)
from agentrl.tools.schema import OpenAIFunctionToolSchema

__all__ = ["CodeInterpreterConfig", "CodeInterpreterTool", "render_result"]


class CodeInterpreterConfig(SandboxLimits):
    """The tool's YAML ``config``: the sandbox limits plus how the sandbox runs."""

    python: str | None = Field(None, description="Interpreter to run (default: agentrl's own).")
    isolation: Isolation | None = Field(
        None, description="Force an isolation level (default: the strongest that works)."
    )
    max_concurrency: int | None = Field(
        None, gt=0, description="Process-wide cap on concurrent runs (default: the CPU count)."
    )
    sandbox_uid: int = Field(65534, ge=1, description="Unprivileged uid used when run as root.")


class CodeInterpreterTool(BaseTool):
    """Runs Python code in a sandboxed subprocess; see ``CodeInterpreterConfig`` for settings."""

    def __init__(
        self,
        config: dict[str, Any] | None = None,
        tool_schema: OpenAIFunctionToolSchema | dict[str, Any] | None = None,
    ) -> None:
        super().__init__(config, tool_schema)
        settings = CodeInterpreterConfig.model_validate(self.config)
        if settings.max_concurrency is not None:
            set_max_concurrency(settings.max_concurrency)
        limits = SandboxLimits.model_validate(
            settings.model_dump(include=set(SandboxLimits.model_fields))
        )
        self.sandbox = Sandbox(
            limits,
            python=settings.python,
            isolation=settings.isolation,
            sandbox_uid=settings.sandbox_uid,
        )

    @classmethod
    def default_tool_schema(cls) -> OpenAIFunctionToolSchema:
        """``code_interpreter(code: str)``."""
        return OpenAIFunctionToolSchema.model_validate(
            {
                "type": "function",
                "function": {
                    "name": "code_interpreter",
                    "description": (
                        "Run Python 3 code in a fresh sandboxed interpreter and return what it "
                        "prints. Nothing persists between calls and there is no network. The "
                        "value of the last line is printed if it is an expression."
                    ),
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "code": {"type": "string", "description": "The Python code to run."}
                        },
                        "required": ["code"],
                    },
                },
            }
        )

    def admission(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """A slot of the worker's sandbox pool (``max_concurrency``)."""
        return sandbox_slot()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Run ``parameters["code"]``; failures of the code are reported in the text, not raised."""
        result = await self.sandbox.run(str(parameters["code"]))
        metrics = {
            "ok": result.ok,
            "exit_code": result.exit_code,
            "wall_time_s": result.wall_time_s,
            "limit_hit": result.error is not None,
        }
        return ToolResponse(text=render_result(result)), 0.0, metrics


def render_result(result: SandboxResult) -> str:
    """The text the model reads: stdout, stderr, then ``[error: ...]`` if the run was cut short."""
    parts = [part.rstrip("\n") for part in (result.stdout, result.stderr) if part.strip()]
    if result.error is not None:
        parts.append(f"[error: {result.error}]")
    return "\n".join(parts) if parts else "(no output)"
