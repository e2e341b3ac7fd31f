"""Datasets of prompts: the row format, readers, length filtering and resumable batching."""

from agentrl.data.config import DataConfig
from agentrl.data.dataset import LoadedDataset, build_dataset, load_custom_rows, load_rows
from agentrl.data.length_filter import LengthFilterReport, filter_long_prompts, prompt_lengths
from agentrl.data.loader import RowLoader
from agentrl.data.readers import parse_hf_spec, read_source
from agentrl.data.row import ChatMessage, DatasetRow, RewardSpec, RowError, parse_row

__all__ = [
    "ChatMessage",
    "DataConfig",
    "DatasetRow",
    "LengthFilterReport",
    "LoadedDataset",
    "RewardSpec",
    "RowError",
    "RowLoader",
    "build_dataset",
    "filter_long_prompts",
    "load_custom_rows",
    "load_rows",
    "parse_hf_spec",
    "parse_row",
    "prompt_lengths",
    "read_source",
]
