"""Reading rows from JSONL, JSON, Parquet, hub datasets and custom dataset classes."""

from __future__ import annotations

import json
import sys
import textwrap
import types

import pytest

from agentrl.data import DataConfig, build_dataset, load_rows, parse_hf_spec
from agentrl.plugins import PluginError


def _rows(n: int) -> list[dict]:
    return [
        {
            "prompt": [{"role": "user", "content": f"q{i}"}],
            "data_source": "toy",
            "reward_model": {"ground_truth": str(i), "style": "rule"},
            "extra_info": {"index": i},
        }
        for i in range(n)
    ]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_and_json_files_load_in_order(tmp_path):
    a = _write_jsonl(tmp_path / "a.jsonl", _rows(3))
    b = tmp_path / "b.json"
    b.write_text(json.dumps(_rows(2)))
    rows = load_rows([a, b])
    assert [r.reward_model.ground_truth for r in rows] == ["0", "1", "2", "0", "1"]


def test_json_file_must_hold_a_list(tmp_path):
    path = tmp_path / "one.json"
    path.write_text(json.dumps(_rows(1)[0]))
    with pytest.raises(ValueError, match="must hold a list"):
        load_rows([path])


def test_parquet_rows_round_trip(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(_rows(4)), path)
    rows = load_rows([path])
    assert [r.extra_info["index"] for r in rows] == [0, 1, 2, 3]
    assert rows[2].messages() == [{"role": "user", "content": "q2"}]


def test_parquet_malformed_row_names_file_and_row(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = _rows(3)
    rows[1]["data_source"] = ""
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(ValueError, match=r"bad\.parquet row 1: malformed row"):
        load_rows([path])


def test_unknown_format_and_missing_file_are_clear(tmp_path):
    csv = tmp_path / "x.csv"
    csv.write_text("a,b\n")
    with pytest.raises(ValueError, match=r"unknown format '\.csv'"):
        load_rows([csv])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_rows([tmp_path / "missing.jsonl"])


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("hf:org/name", ("org/name", None, "train")),
        ("hf:org/name@test", ("org/name", None, "test")),
        ("hf:org/name:default@validation", ("org/name", "default", "validation")),
    ],
)
def test_hf_spec_parsing(spec, expected):
    assert parse_hf_spec(spec) == expected


def test_hf_source_reads_through_datasets(monkeypatch):
    calls = []

    def load_dataset(name, config, split):
        calls.append((name, config, split))
        return iter(_rows(3))

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    rows = load_rows(["hf:org/math@test"])
    assert calls == [("org/math", None, "test")]
    assert [r.extra_info["index"] for r in rows] == [0, 1, 2]


def test_hf_source_without_datasets_installed_says_how_to_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match="pip install datasets"):
        load_rows(["hf:org/math"])


def test_custom_dataset_class_by_path(tmp_path):
    plugin = tmp_path / "my_data.py"
    plugin.write_text(
        textwrap.dedent(
            """
            class Doubler:
                def __init__(self, files, config):
                    self.rows = [
                        {"prompt": f"{f} #{i}", "data_source": "custom",
                         "reward_model": {"ground_truth": i}}
                        for f in files for i in range(2)
                    ]

                def __len__(self):
                    return len(self.rows)

                def __getitem__(self, i):
                    return self.rows[i]
            """
        )
    )
    cfg = DataConfig(
        custom_cls_path=str(plugin), custom_cls_name="Doubler", filter_overlong_prompts=False
    )
    ds = build_dataset(["a", "b"], cfg)
    assert [r.messages()[0]["content"] for r in ds.rows] == ["a #0", "a #1", "b #0", "b #1"]


def test_custom_dataset_bad_row_names_class_and_index(tmp_path):
    plugin = tmp_path / "bad_data.py"
    plugin.write_text(
        "class Bad:\n"
        "    def __init__(self, files, config):\n        pass\n"
        "    def __iter__(self):\n"
        "        yield {'prompt': 'ok', 'data_source': 'x'}\n"
        "        yield {'prompt': 'no source'}\n"
    )
    cfg = DataConfig(
        custom_cls_path=str(plugin), custom_cls_name="Bad", filter_overlong_prompts=False
    )
    with pytest.raises(ValueError, match=r"Bad\[1\]: malformed row"):
        build_dataset([], cfg)


def test_custom_dataset_class_missing_name_lists_what_exists(tmp_path):
    plugin = tmp_path / "empty_data.py"
    plugin.write_text("class Other:\n    pass\n")
    cfg = DataConfig(
        custom_cls_path=str(plugin), custom_cls_name="Missing", filter_overlong_prompts=False
    )
    with pytest.raises(PluginError, match=r"no attribute 'Missing'.*Other"):
        build_dataset([], cfg)


def test_custom_class_config_needs_path_and_name():
    with pytest.raises(ValueError, match=r"custom_cls_path and data\.custom_cls_name"):
        DataConfig(custom_cls_path="x.py")


def test_no_files_is_a_clear_error():
    with pytest.raises(ValueError, match="no data files"):
        build_dataset([], DataConfig(filter_overlong_prompts=False), name="train")
