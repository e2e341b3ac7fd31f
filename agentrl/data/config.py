"""The ``data`` section of the configuration tree."""

from __future__ import annotations

from pydantic import Field, model_validator

from agentrl.core.config import Section

__all__ = ["DataConfig"]


class DataConfig(Section):
    """Where prompts come from and how they are shuffled, filtered and batched."""

    train_files: list[str] = Field(
        default_factory=list,
        description="Training sources: .jsonl/.json/.parquet paths or hf:NAME[:CONFIG][@SPLIT].",
    )
    val_files: list[str] = Field(
        default_factory=list, description="Validation sources, same forms as `train_files`."
    )
    train_batch_size: int = Field(8, ge=1, description="Prompts per training step.")
    val_batch_size: int = Field(64, ge=1, description="Prompts per validation batch.")
    shuffle: bool = Field(True, description="Shuffle training rows each epoch.")
    seed: int = Field(0, description="Shuffle seed; epoch e uses the permutation of (seed, e).")
    drop_last: bool = Field(
        True, description="Drop the last incomplete training batch of every epoch."
    )
    max_prompt_length: int = Field(
        1024, ge=1, description="Prompt limit in tokens, after the chat template is applied."
    )
    filter_overlong_prompts: bool = Field(
        True,
        description="Drop rows whose templated prompt exceeds `max_prompt_length` "
        "(counted and logged once at load time).",
    )
    custom_cls_path: str | None = Field(
        None,
        description="Python file or module of a custom dataset class, built as "
        "`cls(files, data_config)` and yielding rows (dicts or DatasetRow); None = built-in.",
    )
    custom_cls_name: str | None = Field(None, description="Class name inside `custom_cls_path`.")

    @model_validator(mode="after")
    def _custom_cls_needs_both(self) -> DataConfig:
        if (self.custom_cls_path is None) != (self.custom_cls_name is None):
            raise ValueError(
                "set both data.custom_cls_path and data.custom_cls_name, or neither "
                f"(got path={self.custom_cls_path!r}, name={self.custom_cls_name!r})"
            )
        return self
