"""Read raw rows from JSONL, JSON, Parquet files or Hugging Face hub datasets.

A source is a file path (``.jsonl``, ``.json``, ``.parquet``) or a hub spec
``hf:NAME[:CONFIG][@SPLIT]`` (split defaults to ``train``), e.g.
``hf:BytedTsinghua-SIA/DAPO-Math-17k@train``. Each reader yields ``(where, raw)`` pairs,
where ``where`` names the file and row for error messages.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentrl.data.row import RowError

__all__ = ["HF_PREFIX", "parse_hf_spec", "read_source"]

HF_PREFIX = "hf:"


def _read_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path} line {lineno}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as exc:
                raise RowError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None


def _read_json(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise RowError(f"{path}: invalid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, list):
        raise RowError(f"{path}: a .json data file must hold a list of rows (or use .jsonl)")
    for index, raw in enumerate(data):
        yield f"{path} row {index}", raw


def _read_parquet(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(
            f"reading {path} needs pyarrow, which is not installed: `pip install pyarrow`"
        ) from None
    table = pq.read_table(path)
    for index, raw in enumerate(table.to_pylist()):
        yield f"{path} row {index}", raw


def parse_hf_spec(spec: str) -> tuple[str, str | None, str]:
    """Split ``hf:NAME[:CONFIG][@SPLIT]`` into ``(name, config, split)``."""
    body = spec.removeprefix(HF_PREFIX)
    body, _, split = body.partition("@")
    name, _, config = body.partition(":")
    if not name:
        raise ValueError(f"hub source {spec!r} has no dataset name; use hf:NAME[:CONFIG][@SPLIT]")
    return name, config or None, split or "train"


def _read_hf(spec: str) -> Iterator[tuple[str, Any]]:
    try:
        import datasets
    except ImportError:
        raise ImportError(
            f"loading {spec} needs the Hugging Face `datasets` package, which is not "
            "installed: `pip install datasets` (or convert the data to JSONL/Parquet)"
        ) from None
    name, config, split = parse_hf_spec(spec)
    dataset = datasets.load_dataset(name, config, split=split)
    for index, raw in enumerate(dataset):
        yield f"{spec} row {index}", raw


def read_source(source: str | Path) -> Iterator[tuple[str, Any]]:
    """Yield ``(where, raw_row)`` for every row of ``source`` (file path or ``hf:`` spec)."""
    text = str(source)
    if text.startswith(HF_PREFIX):
        return _read_hf(text)
    path = Path(text).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} does not exist (cwd: {Path.cwd()})")
    readers = {".jsonl": _read_jsonl, ".json": _read_json, ".parquet": _read_parquet}
    reader = readers.get(path.suffix.lower())
    if reader is None:
        raise ValueError(
            f"data file {path}: unknown format {path.suffix!r}; use .jsonl, .json, .parquet "
            "or an hf:NAME[@SPLIT] hub spec"
        )
    return reader(path)
