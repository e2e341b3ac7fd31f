"""Every metric name the docs mention is one the code emits.

A metric name in the docs is a backticked ``prefix/...`` with a known prefix
(``rollout/``, ``actor/``, ``mismatch/``, ...). The code builds names from string
literals, f-strings (``f"rollout/{key}"``), ``+`` concatenations (``PREFIX + k``) and
``removeprefix`` (``f"val/{k.removeprefix('reward/')}"``); each becomes a pattern of
literal text and holes. A name is emitted when it is a literal of the code, or matches a
pattern whose every hole holds an emitted name or a literal (recursively); literals of the
docs' own example code count too (``reward/acc/mean`` comes from the guide's reward
function returning ``{"acc": ...}``). A misspelled segment is a literal nowhere, so it fails.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("agentrl", "agent_loops", "tools", "server")
DOC_FILES = (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))
PREFIXES = (
    "actor",
    "async",
    "critic",
    "dapo",
    "mismatch",
    "perf",
    "reward",
    "rollout",
    "timing",
    "tool_calls",
    "val",
)
DOC_METRIC = re.compile(rf"`((?:{'|'.join(PREFIXES)})/[A-Za-z0-9_./-]*[A-Za-z0-9_])`")


class Hole:
    """A formatted value in a name pattern; its text, with ``prefix`` put back, must be a
    known name (``prefix`` undoes a ``removeprefix``)."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix


Pattern = tuple[str | Hole, ...]


def _module_constants(tree: ast.Module) -> dict[str, str]:
    return {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def _parts(node: ast.AST, constants: dict[str, str]) -> Pattern:
    """The pattern of a string-valued expression (anything unknown is a hole)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return (node.value,)
    if isinstance(node, ast.Name) and node.id in constants:
        return (constants[node.id],)
    if isinstance(node, ast.JoinedStr):
        return tuple(p for value in node.values for p in _parts(value, constants))
    if isinstance(node, ast.FormattedValue):
        return _parts(node.value, constants) if node.format_spec is None else (Hole(),)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _parts(node.left, constants) + _parts(node.right, constants)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "removeprefix"
        and len(node.args) == 1
        and isinstance(node.args[0], ast.Constant)
    ):
        return (Hole(node.args[0].value),)
    return (Hole(),)


def _scan(code: str, literals: set[str], patterns: set[Pattern]) -> None:
    tree = ast.parse(code)
    constants = _module_constants(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            literals.add(node.value)
        elif isinstance(node, ast.JoinedStr | ast.BinOp):
            parts = _parts(node, constants)
            text = "".join(p for p in parts if isinstance(p, str))
            if any(isinstance(p, Hole) for p in parts) and text and not re.search(r"\s", text):
                patterns.add(parts)


def _doc_code_blocks() -> list[str]:
    blocks = []
    for doc in DOC_FILES:
        blocks += re.findall(r"^```python\n(.*?)^```", doc.read_text(), re.DOTALL | re.MULTILINE)
    return blocks


@cache
def _emitted() -> tuple[frozenset[str], tuple[Pattern, ...]]:
    literals: set[str] = set()
    patterns: set[Pattern] = set()
    for folder in SOURCE_DIRS:
        for path in (ROOT / folder).rglob("*.py"):
            if "testing" not in path.relative_to(ROOT).parts:
                _scan(path.read_text(), literals, patterns)
    for block in _doc_code_blocks():
        _scan(block, literals, set())  # example keys only, never example name patterns
    return frozenset(literals), tuple(patterns)


def _matches(parts: Pattern, name: str, known) -> bool:
    if not parts:
        return not name
    head, rest = parts[0], parts[1:]
    if isinstance(head, str):
        return name.startswith(head) and _matches(rest, name[len(head) :], known)
    return any(
        known(head.prefix + name[:end]) and _matches(rest, name[end:], known)
        for end in range(1, len(name) + 1)
    )


def is_emitted(name: str) -> bool:
    literals, patterns = _emitted()

    @cache
    def known(text: str, depth: int = 0) -> bool:
        if text in literals:
            return True
        if depth > 4:
            return False
        return any(
            _matches(p, text, lambda sub: len(sub) < len(text) and known(sub, depth + 1))
            for p in patterns
        )

    return known(name)


def documented_metric_names() -> dict[str, list[str]]:
    """Metric name -> the doc files that mention it."""
    found: dict[str, list[str]] = {}
    for doc in DOC_FILES:
        for name in DOC_METRIC.findall(doc.read_text()):
            found.setdefault(name, []).append(doc.relative_to(ROOT).as_posix())
    return found


def test_docs_mention_metric_names():
    names = documented_metric_names()
    assert len(names) >= 20, sorted(names)
    assert "tool_calls/invalid_arguments" in names or "rollout/tool_calls/invalid_arguments" in (
        names
    )


@pytest.mark.parametrize("name", sorted(documented_metric_names()))
def test_documented_metric_name_is_emitted_by_the_code(name):
    where = ", ".join(documented_metric_names()[name])
    assert is_emitted(name), f"{where} mention `{name}`, which no code emits"


@pytest.mark.parametrize(
    "name",
    [
        "rollout/tool_calls/ok",
        "tool_calls/invalid_arguments",
        "mismatch/mismatch_kl",
        "mismatch/rollout_is_mean",
        "val/acc/mean",
        "dapo/num_groups_kept",
        "actor/pg_loss",
    ],
)
def test_names_the_code_builds_are_recognised(name):
    assert is_emitted(name)


@pytest.mark.parametrize(
    "name",
    [
        "tool_calls/invalid_args",  # the name docs/guides/tools.md used to give
        "rollout/tool_calls/okay",
        "mismatch/rollout_is_means",
        "dapo/num_group_kept",
        "val/acc/meen",
        "actor/pg_los",
    ],
)
def test_misspelled_names_are_not(name):
    assert not is_emitted(name)
