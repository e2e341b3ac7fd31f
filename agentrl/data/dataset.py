"""Build a dataset: read the sources (or a custom dataset class), validate rows, filter by length.

    ds = build_dataset(cfg.data.train_files, cfg.data, tokenizer, name="train")
    loader = RowLoader(ds.rows, cfg.data.train_batch_size, seed=cfg.data.seed)

A custom dataset class (``data.custom_cls_path`` + ``data.custom_cls_name``) is built as
``cls(files, data_config)`` and must be iterable (a sequence or a generator of rows); each
item is a dict in the row format or a ``DatasetRow``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.data.config import DataConfig
from agentrl.data.length_filter import ChatTokenizer, LengthFilterReport, filter_long_prompts
from agentrl.data.readers import read_source
from agentrl.data.row import DatasetRow, parse_row
from agentrl.plugins import load_object

__all__ = ["LoadedDataset", "build_dataset", "load_custom_rows", "load_rows"]


@dataclass(frozen=True)
class LoadedDataset:
    """Validated rows and, when length filtering ran, its report."""

    rows: list[DatasetRow]
    filter_report: LengthFilterReport | None = None


def load_rows(sources: Sequence[str | Path]) -> list[DatasetRow]:
    """Read and validate every row of ``sources``, in order."""
    return [parse_row(raw, where) for source in sources for where, raw in read_source(source)]


def load_custom_rows(files: Sequence[str], config: DataConfig) -> list[DatasetRow]:
    """Build ``config``'s custom dataset class on ``files`` and validate its rows."""
    if config.custom_cls_path is None or config.custom_cls_name is None:
        raise ValueError("set data.custom_cls_path and data.custom_cls_name to use a custom class")
    cls = load_object(config.custom_cls_path, config.custom_cls_name)
    if not callable(cls):
        raise TypeError(f"{config.custom_cls_path}:{config.custom_cls_name} is not a class")
    instance = cls(list(files), config)
    try:
        items = iter(instance)
    except TypeError:
        raise TypeError(
            f"custom dataset {config.custom_cls_name} must be iterable (define __iter__ or "
            f"__len__/__getitem__), got {type(instance).__name__}"
        ) from None
    return [parse_row(raw, f"{config.custom_cls_name}[{index}]") for index, raw in enumerate(items)]


def build_dataset(
    files: Sequence[str],
    config: DataConfig,
    tokenizer: ChatTokenizer | None = None,
    *,
    tools: list[dict[str, Any]] | None = None,
    name: str = "dataset",
) -> LoadedDataset:
    """Load ``files`` (built-in readers or the configured custom class) and, when
    ``config.filter_overlong_prompts``, drop prompts longer than ``config.max_prompt_length``
    tokens rendered with ``tokenizer``'s chat template (and ``tools``)."""
    if config.custom_cls_path is not None:
        rows = load_custom_rows(files, config)
    elif not files:
        raise ValueError(f"{name}: no data files given (set data.train_files / data.val_files)")
    else:
        rows = load_rows(files)
    report = None
    if config.filter_overlong_prompts:
        if tokenizer is None:
            raise ValueError(
                f"{name}: filtering overlong prompts needs a tokenizer; pass one or set "
                "data.filter_overlong_prompts=false"
            )
        rows, report = filter_long_prompts(
            rows, tokenizer, config.max_prompt_length, tools=tools, name=name
        )
    if not rows:
        raise ValueError(
            f"{name}: no rows left from {list(files)}"
            + (
                f" ({report.dropped} were longer than {report.max_prompt_length} tokens)"
                if report
                else ""
            )
        )
    return LoadedDataset(rows=rows, filter_report=report)
