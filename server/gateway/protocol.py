"""Request bodies of the gateway's endpoints (the OpenAI wire format, validated).

Unknown fields are ignored (clients and frameworks send many optional OpenAI fields the
gateway has no use for); known fields are type-checked and range-checked, so a bad value
is a 400 naming the parameter. NaN and infinity are rejected everywhere.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

SESSION_ID_PATTERN = r"^[A-Za-z0-9._:@-]{1,128}$"


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class TextPart(_Body):
    """One part of a multi-part message content; only text is supported."""

    type: Literal["text", "input_text", "output_text"]
    text: str


class FunctionCallSpec(_Body):
    name: str = Field(min_length=1, max_length=256)
    arguments: str | dict[str, Any] = "{}"


class ToolCallSpec(_Body):
    """An assistant message's tool call, as the client sends it back."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallSpec


class ChatMessage(_Body):
    """One chat message. ``developer`` is treated as ``system``."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallSpec] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = Field(
        None, description="vLLM's name for `reasoning_content` (either is accepted)."
    )

    def reasoning_text(self) -> str | None:
        """The assistant's reasoning as the client echoed it (None if it sent none)."""
        return self.reasoning_content if self.reasoning_content is not None else self.reasoning

    def text(self) -> str:
        """The content as one string (parts joined, None as empty)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionSpec(_Body):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolSpec(_Body):
    """One entry of the request's ``tools`` list."""

    type: Literal["function"] = "function"
    function: FunctionSpec


class NamedToolChoice(_Body):
    type: Literal["function"] = "function"
    function: dict[str, str]


class StreamOptions(_Body):
    include_usage: bool = False


Stop = str | Annotated[list[str], Field(max_length=16)] | None


class _SamplingFields(_Body):
    """Sampling fields shared by chat and text completions."""

    model: str
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, description="agentrl extension: -1 (off) or >= 1")
    max_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1)
    seed: int | None = None
    stop: Stop = None
    stream: bool = False
    stream_options: StreamOptions | None = None

    @field_validator("top_k")
    @classmethod
    def _check_top_k(cls, value: int | None) -> int | None:
        if value is not None and (value == 0 or value < -1):
            raise ValueError("top_k must be -1 (off) or >= 1")
        return value

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        return [s for s in stops if s]


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage]
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)

    @field_validator("messages")
    @classmethod
    def _non_empty(cls, value: list[ChatMessage]) -> list[ChatMessage]:
        if not value:
            raise ValueError("messages must contain at least one message")
        return value

    def completion_limit(self) -> int | None:
        """``max_completion_tokens`` (the newer name) or ``max_tokens``."""
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions``: one prompt, as text or token ids."""

    prompt: str | list[StrictInt] | list[str]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False

    @model_validator(mode="after")
    def _one_prompt(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt must not be empty")
        if isinstance(self.prompt, list) and isinstance(self.prompt[0], str):
            if len(self.prompt) != 1:
                raise ValueError("send one prompt per request (batched prompts are unsupported)")
            self.prompt = self.prompt[0]
        if self.prompt == "":
            raise ValueError("prompt must not be empty")
        if self.echo:
            raise ValueError("echo is not supported")
        return self


class GenerateRequest(_Body):
    """``POST /v1/generate``: token ids in, token ids + logprobs + versions out."""

    prompt_ids: list[StrictInt] = Field(min_length=1)
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = -1
    seed: int | None = None
    stop_token_ids: list[StrictInt] = Field(default_factory=list)
    ignore_eos: bool = False


class RewardRequest(_Body):
    """``POST /v1/sessions/{id}/reward``: a session reward, per-call rewards, or both."""

    reward: float | None = None
    rewards: dict[str, float] | None = Field(
        None, description="call id (the `id` of a completion response) -> reward"
    )

    @model_validator(mode="after")
    def _something(self) -> RewardRequest:
        if self.reward is None and not self.rewards:
            raise ValueError("give `reward` (a number) and/or `rewards` ({call_id: number})")
        return self


class SessionRequest(_Body):
    """``POST /v1/sessions/{id}``: open a session before its first call."""

    group_id: str | None = Field(
        None,
        pattern=SESSION_ID_PATTERN,
        description="the session's group (as `x-group-id`): one GRPO group in training",
    )
    managed: bool = Field(
        False,
        description="driven by ExternalAgentLoop, which takes the samples from finish; "
        "training sinks (`gateway.sink: queue`) skip it",
    )


class FinishRequest(_Body):
    """``POST /v1/sessions/{id}/finish``: optional final session reward and group."""

    reward: float | None = None
    group_id: str | None = Field(None, pattern=SESSION_ID_PATTERN)
